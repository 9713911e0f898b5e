"""Distinct ids without a full sort, for the source transforms (dedup at the source: comm/placement.py).

`torch.unique(..., sorted=True, return_inverse=True)` sorts every id: at DLRMv4's
reference shape that is ~8 M ids per batch and most of the loader's time. A table's
ids are bounded by its rows and repeat heavily, so `DistinctIds` marks the ids seen
in a flag per row, reads the distinct ones off in row order (sorted, as the sort
gives them) and each id's rank among them (or a label the caller gives each distinct
id: the transform's KJT row) from a table of the table's size: two passes over the ids
and one over the flags. `unique_rows` is the multi-column form
(a pooled bag as a row) by `numpy.lexsort`, one stable pass per column, where
torch's `unique(dim=0)` sorts the rows with a row comparator. Both give exactly
what torch.unique gives (the same values, order, dtypes and inverse); inputs where
the counting pass would not pay (few ids over many rows) or that are not on the CPU
take torch.unique itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dlrmtrain.recycled import RecycledArrays

SMALL = 4096
"""fewer ids than this: torch.unique (its sort costs less than the flags' allocation)"""
ROWS_PER_ID = 64
"""the counting pass runs where the ids' span of rows is at most this many per id: it costs
roughly 1 ns per row (zeroing and scanning the flags) and tens of ns per id, the sort ~200 ns
per id (the reference shape's item table on one loaded AMD EPYC core; scripts/bench_yambda_data.py
--sections transform times the whole)"""


RANK_TABLES = RecycledArrays(keep=4, slack=None)
"""The rank tables (up to a table's rows of int64: 75 MB for DLRMv4's items), used again
(dlrmtrain/recycled.py) rather than paged in anew each time: a table's ranks fit in any
longer buffer (only its seen rows are written and read), so each loader thread cycles one"""


class DistinctIds:
    """The distinct ids of `parts` together (each id in [0, bound)), sorted (`values`), and
    where each position's id is among them (`inverse`). Raises ValueError for an id outside
    [0, bound) (its callers then name the feature)."""

    def __init__(self, parts: Sequence[torch.Tensor], bound: int) -> None:
        self._parts = list(parts)
        n = sum(p.numel() for p in parts)
        dtype = parts[0].dtype if parts else torch.int64
        self._sorted: list[torch.Tensor] | None = None  # the sort's inverse, where it ran
        self._rows: np.ndarray | None = None             # else the distinct rows, for the rank table
        ranges = [torch.aminmax(p) for p in parts if p.numel()]
        lo, hi = (min(int(r.min) for r in ranges), max(int(r.max) for r in ranges)) if n else (0, -1)
        if lo < 0 or hi >= bound:
            raise ValueError(f"distinct ids: ids in [{lo}, {hi}] outside [0, {bound})")
        if n >= SMALL and hi + 1 <= ROWS_PER_ID * n and all(p.device.type == "cpu" for p in parts):
            seen = np.zeros(hi + 1, dtype=np.bool_)  # rows past the largest id cannot be seen
            for p in parts:
                seen[p.numpy()] = True
            self._rows = np.flatnonzero(seen)
            self.values = torch.from_numpy(self._rows).to(dtype)
            return
        ids = torch.cat(self._parts) if parts else torch.zeros(0, dtype=dtype)
        self.values, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        self._sorted = list(torch.split(inverse.to(torch.int64), [p.numel() for p in parts]))

    def inverse(self, labels: torch.Tensor | None = None, out: Sequence[torch.Tensor] | None = None
                ) -> list[torch.Tensor]:
        """Per part, each position's index among `values` (int64) or, given `labels` (int64, one
        per distinct id), that index's label: `labels[inverse]` in one read of the ids. `out`:
        int64 tensors, one per part, to write them in (e.g. views of one: no concatenation)."""
        if self._sorted is not None:
            made = self._sorted if labels is None else [labels[i] for i in self._sorted]
        else:
            rank = RANK_TABLES.empty(int(self._rows[-1]) + 1)  # only the seen rows are written and read
            rank[self._rows] = np.arange(self._rows.size) if labels is None else labels.numpy()
            if out is not None:  # the ids were checked to lie in the table: clip skips the bounds check
                for p, o in zip(self._parts, out):
                    np.take(rank, p.numpy(), out=o.numpy(), mode="clip")
                return list(out)
            made = [torch.from_numpy(rank[p.numpy()]) for p in self._parts]
        if out is not None:
            for m, o in zip(made, out):
                o.copy_(m)
            return list(out)
        return made


def unique_keys(parts: Sequence[torch.Tensor], bound: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`torch.unique(torch.cat(parts), sorted=True, return_inverse=True)` with its inverse (int64)
    split per part, bitwise, for ids in [0, bound) (`DistinctIds`)."""
    found = DistinctIds(parts, bound)
    return found.values, found.inverse()


def unique_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.unique(rows, dim=0, sorted=True, return_inverse=True)` of a 2-D integer tensor,
    bitwise: its distinct rows in lexicographic order and each row's index among them."""
    if rows.dim() != 2 or rows.shape[0] < 2 or rows.shape[1] == 0 or rows.device.type != "cpu" \
            or rows.dtype.is_floating_point:  # floats: -0.0 / NaN order as torch orders them
        return torch.unique(rows, dim=0, sorted=True, return_inverse=True)
    a = rows.numpy()
    order = np.lexsort(a.T[::-1])  # lexsort's last key is its first: column 0 leads
    ordered = a[order]
    starts = np.empty(a.shape[0], dtype=np.bool_)  # each row that differs from the one before
    starts[0] = True
    np.any(ordered[1:] != ordered[:-1], axis=1, out=starts[1:])
    inverse = np.empty(a.shape[0], dtype=np.int64)
    inverse[order] = np.cumsum(starts) - 1
    return torch.from_numpy(ordered[starts]), torch.from_numpy(inverse)
