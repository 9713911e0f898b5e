"""dedup for table- and column-wise sharding: the planner of `DedupDist` (dist.py).

For every (feature, sample-rank) block, the owner (ids from the input
all-to-all) and the sample rank (its own ids) compute the same unique bags
(comm/README.md, "dedup in one paragraph"). Forward: the owner sends one row
per unique bag, the receiver expands with its inverse. Backward: the receiver
segment-sums the gradient per unique bag and sends that; the owner writes each
sum at the bag's first occurrence (zeros elsewhere), which the fused embedding
backward turns into the same row update as the uncompressed gradient, up to
float summation order. Gradients are divided by the world size like TorchRec's
all-to-all backward.

Host syncs: one per dist per step (all blocks' unique counts in one `.tolist()`),
plus one more only when a bag is longer than the key width learned so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.dedup.kernels import BlocksUnique, blocks_unique, expand_units, host_to_device, segment_units
from dlrmtrain.comm.dedup.plan import DedupPlan, DedupStep
from dlrmtrain.comm.layout import DistLayout, FeatureEntry


@dataclass
class _Side:
    """One end's unique bags: its dedup blocks grouped by key width, each group keyed in one call."""

    groups: list[tuple[BlocksUnique, list[tuple[int, int]]]]
    """(the group's uniques, its blocks as (entry, block)), one group per key width"""
    slot: dict[tuple[int, int], tuple[int, int]]
    """(entry, block) -> (group, position in it); absent: a table sent in full"""


@dataclass
class _Blocks:
    """One step's unique bags of both ends and, after the host sync, their counts."""

    owner: _Side
    """[local entry][sample rank]: the bags this rank sends rows for"""
    sample: _Side
    """[entry of the all-to-all][0]: this rank's own bags"""
    counts: dict[tuple[int, int, int], int] = field(default_factory=dict)
    """(id(side), entry, block) -> unique bags"""

    def count(self, side: _Side, i: int, b: int, size: int) -> int:
        """Rows block (i, b) of `side` puts on the wire: its unique bags, or all `size` bags sent in full."""
        return self.counts[(id(side), i, b)] if (i, b) in side.slot else size


class TableWisePlanner:
    """Plans the unique-row all-to-all that replaces TorchRec's `TwPooledEmbeddingDist`.

    `dedup_tables` selects the tables whose blocks are deduplicated; the other
    tables of the same all-to-all travel in full (codec `none` per table).
    """

    fallback_warning = "table-/column-wise dedup never falls back"

    def __init__(self, layout: DistLayout, dedup_tables: set[str], rank: int) -> None:
        self.rank = rank
        self.world_size = layout.world_size
        self.layout = layout
        self.local_entries = layout.entries_per_rank[rank]
        self.all_entries = layout.all_entries()
        self.dedup_tables = dedup_tables
        dims = [e.dim for e in self.all_entries]
        self.unit = math.gcd(*dims) if dims else 1
        # learned key widths (longest bag so far), one per block; both ends of a
        # block see the same ids, so they update them identically
        self._owner_widths = [[1] * self.world_size for _ in self.local_entries]
        self._sample_widths = [1] * len(self.all_entries)

    # --------------------------------------------------------------------- plan
    def _uniques(self, kjt: KeyedJaggedTensor, entries: list[FeatureEntry], stride: int,
                 starts: list[int], sizes: list[int], widths: list[list[int]]) -> _Side:
        """The dedup blocks of `kjt` (entry i's block b: bags i * stride + starts[b], sizes[b] of them),
        grouped by key width: one `blocks_unique` call per width, whatever the number of blocks."""
        by_width: dict[int, list[tuple[int, int]]] = {}
        for i, entry in enumerate(entries):
            if entry.table in self.dedup_tables:
                for b in range(len(starts)):
                    by_width.setdefault(widths[i][b], []).append((i, b))
        side = _Side([], {})
        for width, members in sorted(by_width.items()):
            uniques = blocks_unique(kjt.values(), kjt.offsets(), kjt.lengths(),
                                    [i * stride + starts[b] for i, b in members], [sizes[b] for _, b in members],
                                    width, [entries[i].num_embeddings for i, _ in members])
            side.slot.update({m: (len(side.groups), k) for k, m in enumerate(members)})
            side.groups.append((uniques, members))
        return side

    def _read_counts(self, sides: list[_Side]) -> tuple[list[int], list[bool], list[bool]]:
        """The host sync: counts and flags of every block of `sides` in one transfer, group by group."""
        groups = [u for side in sides for u, _ in side.groups]
        if not groups:
            return [], [], []
        flat = torch.cat([torch.stack([u.counts, u.overflow.long(), u.bad_ids.long()]) for u in groups], 1)
        counts, overflow, bad = flat.tolist()
        return counts, [bool(o) for o in overflow], [bool(x) for x in bad]

    def plan(self, step: DedupStep) -> DedupPlan:
        blocks = self._both_ends(step)
        # one host sync for every block of both ends; a retry only if a bag outgrew its key width
        for attempt in range(2):
            slots = [(side, i, b) for side in (blocks.owner, blocks.sample)
                     for _, members in side.groups for i, b in members]
            counts, overflow, bad = self._read_counts([blocks.owner, blocks.sample])
            for (side, i, _), is_bad in zip(slots, bad):
                if is_bad:
                    entry = (self.local_entries if side is blocks.owner else self.all_entries)[i]
                    raise ValueError(f"feature {entry.feature!r} (table {entry.table!r}): ids outside "
                                     f"[0, {entry.num_embeddings}) reached the dedup codec")
            if not any(overflow):
                break
            assert attempt == 0, "key width still too small after widening"
            step.stats.extra_syncs += 1
            self._widen(step, blocks, slots, overflow)
            blocks = self._both_ends(step)
        blocks.counts = {(id(side), i, b): c for (side, i, b), c in zip(slots, counts)}

        plan = self._build_plan(step, blocks)
        self._account(step, blocks)
        return plan

    def _both_ends(self, step: DedupStep) -> _Blocks:
        return _Blocks(
            owner=self._uniques(step.owner_kjt, self.local_entries, step.global_batch, step.starts, step.sizes,
                                self._owner_widths),
            sample=self._uniques(step.sample_kjt, self.all_entries, step.batch, [0], [step.batch],
                                 [[w] for w in self._sample_widths]))

    def _widen(self, step: DedupStep, blocks: _Blocks, slots: list[tuple[_Side, int, int]],
               overflow: list[bool]) -> None:
        """Grow the key width of overflowing blocks to their longest bag (the caller redoes the uniques)."""
        todo = []
        for (side, i, b), over in zip(slots, overflow):
            if over:
                if side is blocks.owner:
                    todo.append((True, i, b, step.owner_kjt, i * step.global_batch + step.starts[b], step.sizes[b]))
                else:
                    todo.append((False, i, b, step.sample_kjt, i * step.batch, step.batch))
        # the extra host sync (counted in extra_syncs): every overflowing block's longest bag at once
        longest = torch.stack([kjt.lengths()[g0:g0 + n].max() for *_, kjt, g0, n in todo]).tolist()
        for (is_owner, i, b, *_), width in zip(todo, longest):
            if is_owner:
                self._owner_widths[i][b] = width
            else:
                self._sample_widths[i] = width

    @staticmethod
    def _first_rows(side: _Side, device: torch.device, longest: int) -> tuple[torch.Tensor, list[int], int]:
        """Every group's `first` flattened into one tensor, then 0 .. longest - 1 (a table sent in full):
        the tensor, where each group starts in it and where the identity rows start."""
        parts, group_at, at = [], [], 0
        for u, _ in side.groups:
            group_at.append(at)
            parts.append(u.first.reshape(-1))
            at += u.first.numel()
        parts.append(torch.arange(longest, device=device))
        return torch.cat(parts), group_at, at

    def _build_plan(self, step: DedupStep, blocks: _Blocks) -> DedupPlan:
        """The plan's two indices, each from a few whole-message ops (none per rank or per entry)."""
        unit, W, device = self.unit, self.world_size, step.device
        owner, sample, count = blocks.owner, blocks.sample, blocks.count
        sizes, B, starts = step.sizes, step.batch, step.starts
        # owner: message to rank s = its local entries in order, unique rows of each
        local_units = sum(e.dim for e in self.local_entries) // unit
        col_units = [0]
        for e in self.local_entries:
            col_units.append(col_units[-1] + e.dim // unit)
        source, group_at, identity_at = self._first_rows(owner, device, max(sizes, default=0))
        segments, send_splits = [], []  # (offset in source, rows, unit added, units per row)
        for s in range(W):
            for i, entry in enumerate(self.local_entries):
                n, where = count(owner, i, s, sizes[s]), owner.slot.get((i, s))
                at = identity_at if where is None else \
                    group_at[where[0]] + where[1] * owner.groups[where[0]][0].first.shape[1]
                segments.append((at, n, starts[s] * local_units + col_units[i], entry.dim // unit))
            send_splits.append(sum(n * d * unit for _, n, _, d in segments[-len(self.local_entries):])
                               if self.local_entries else 0)
        send_index = segment_units(source, segments, local_units)
        # receiver: output unit (b, column) <- receive-buffer unit of bag b's unique row
        recv_splits, columns, unit_offset, j = [], [], 0, 0
        for r in range(W):
            elems = 0
            for entry in self.layout.entries_per_rank[r]:
                d, n = entry.dim // unit, count(sample, j, 0, B)
                columns += [(j, d, unit_offset + k) for k in range(d)]
                unit_offset += n * d
                elems += n * entry.dim
                j += 1
            recv_splits.append(elems)
        recv_index = expand_units(self._sample_inverse(sample, B, device), columns)
        out_dim = sum(e.dim for e in self.all_entries)
        return DedupPlan(unit, send_index, recv_index, send_splits, recv_splits, (B, out_dim))

    def _sample_inverse(self, sample: _Side, B: int, device: torch.device) -> torch.Tensor:
        """[entries, B]: each bag's unique row per entry of the all-to-all (itself for a table sent in full)."""
        inverse = torch.arange(B, device=device).repeat(len(self.all_entries), 1)
        for u, members in sample.groups:
            inverse.index_copy_(0, host_to_device([i for i, _ in members], device), u.inverse.view(-1, B))
        return inverse

    def _account(self, step: DedupStep, blocks: _Blocks) -> None:
        """Add this step's bytes to the per-table counters: each block's unique bags, or all of
        them for a table sent in full."""
        owner, sample, count = blocks.owner, blocks.sample, blocks.count
        sent = [[(count(owner, i, s, n), n) for s, n in enumerate(step.sizes)]
                for i in range(len(self.local_entries))]
        received = [count(sample, j, 0, step.batch) for j in range(len(self.all_entries))]
        step.account_table_wise(self.layout, self.rank, sent, received)
