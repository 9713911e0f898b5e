"""Multi-hot materialisation for DLRM-DCNv2, as the MLPerf reference does it.

The reference (mlcommons training, recommendation_v2/torchrec_dlrm, `Multihot`)
seeds numpy's global RNG with 0 once and then, table by table in order, builds a
lookup table `[arange(n)[:, None], randint(0, n, size=(n, k - 1))]` (the first id
of every bag is the one-hot id itself). A sample's bag for table t is
`lookup_t[id % n_t]`. Identical one-hot ids therefore give identical bags.

The tables are generated in row chunks, which draws the same random stream as the
reference's single call (checked by a test). At MLPerf sizes they take
sum(n_t * k_t) * 4 bytes ~ 24 GB: pass `cache_dir` to keep them memory-mapped on disk.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from dlrmtrain.features import NUM_SPARSE
from dlrmtrain.data.parts import Part, RowBlock

REFERENCE_SEED = 0


class MultiHotLookup:
    """Per-table one-hot -> multi-hot lookup tables, bit-identical to the reference's."""

    def __init__(
        self, table_sizes: Sequence[int], multi_hot_sizes: Sequence[int], seed: int = REFERENCE_SEED,
        cache_dir: str | Path | None = None, chunk_rows: int = 1 << 20,
    ) -> None:
        if len(table_sizes) != NUM_SPARSE or len(multi_hot_sizes) != NUM_SPARSE:
            raise ValueError(f"need {NUM_SPARSE} table sizes and multi-hot sizes")
        if min(multi_hot_sizes) < 1:
            raise ValueError(f"multi-hot sizes must be >= 1, got {list(multi_hot_sizes)}")
        self.table_sizes = [int(n) for n in table_sizes]
        self.multi_hot_sizes = [int(k) for k in multi_hot_sizes]
        self.tables = self._build(seed, Path(cache_dir) if cache_dir else None, chunk_rows)

    def _build(self, seed: int, cache_dir: Path | None, chunk_rows: int) -> list[np.ndarray]:
        rng = np.random.RandomState(seed)  # legacy MT19937 stream == np.random.seed(seed)
        tag = f"seed{seed}_" + "_".join(f"{n}x{k}" for n, k in zip(self.table_sizes, self.multi_hot_sizes))
        done_marker = cache_dir / f"done_{hashlib.sha1(tag.encode()).hexdigest()[:12]}.txt" if cache_dir else None
        if done_marker is not None and done_marker.exists() and done_marker.read_text() == tag:
            return [np.load(cache_dir / f"lookup_{t}.npy", mmap_mode="r") for t in range(NUM_SPARSE)]
        tables = []
        for t, (n, k) in enumerate(zip(self.table_sizes, self.multi_hot_sizes)):
            if cache_dir is not None:
                cache_dir.mkdir(parents=True, exist_ok=True)
                table = np.lib.format.open_memmap(cache_dir / f"lookup_{t}.npy", "w+", np.int32, (n, k))
            else:
                table = np.empty((n, k), dtype=np.int32)
            for lo in range(0, n, chunk_rows):
                hi = min(n, lo + chunk_rows)
                table[lo:hi, 0] = np.arange(lo, hi)
                table[lo:hi, 1:] = rng.randint(0, n, size=(hi - lo, k - 1))
            tables.append(table)
        if done_marker is not None:
            for table in tables:
                table.flush()  # type: ignore[union-attr]
            tmp = done_marker.with_suffix(".tmp")
            tmp.write_text(tag)
            os.replace(tmp, done_marker)
        return tables

    def expand(self, table: int, ids: np.ndarray) -> np.ndarray:
        """One-hot ids [n] of `table` -> bags [n, k_table] (ids taken modulo the table size)."""
        return self.tables[table][np.asarray(ids, dtype=np.int64) % self.table_sizes[table]]

    def expand_all(self, sparse: np.ndarray) -> list[np.ndarray]:
        """[n, 26] one-hot ids -> 26 arrays [n, k_t]."""
        return [self.expand(t, sparse[:, t]) for t in range(NUM_SPARSE)]


class MultiHotPart:
    """A one-hot part seen through the lookup: bags are made on the fly at read time."""

    def __init__(self, part: Part, lookup: MultiHotLookup) -> None:
        self.part, self.lookup = part, lookup
        self.name, self.rows = part.name, part.rows

    def read(self, start: int, stop: int) -> RowBlock:
        block = self.part.read(start, stop)
        if isinstance(block.sparse, list):
            raise ValueError(f"{self.name} is already multi-hot")
        return RowBlock(block.dense, self.lookup.expand_all(np.asarray(block.sparse)), block.labels)


def materialize_day(part: Part, lookup: MultiHotLookup, out_path: str | Path, chunk_rows: int = 1 << 20) -> None:
    """Write `part`'s bags as TorchRec's `day_{i}_sparse_multi_hot.npz` (keys "0".."25")."""
    out_path = Path(out_path)
    tmp_dir = out_path.with_name(f".{out_path.name}.tmp")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for t, k in enumerate(lookup.multi_hot_sizes):
        arrays[str(t)] = np.lib.format.open_memmap(tmp_dir / f"{t}.npy", "w+", np.int32, (part.rows, k))
    for lo in range(0, part.rows, chunk_rows):
        hi = min(part.rows, lo + chunk_rows)
        sparse = np.asarray(part.read(lo, hi).sparse)
        for t in range(NUM_SPARSE):
            arrays[str(t)][lo:hi] = lookup.expand(t, sparse[:, t])
    tmp_npz = out_path.with_name(out_path.name + ".tmp.npz")
    np.savez(tmp_npz, **arrays)  # uncompressed, so readers can memory-map the members
    os.replace(tmp_npz, out_path)
    for t in range(NUM_SPARSE):
        del arrays[str(t)]
        os.remove(tmp_dir / f"{t}.npy")
    tmp_dir.rmdir()
