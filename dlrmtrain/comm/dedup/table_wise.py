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

from dlrmtrain.comm.dedup.kernels import BlockUnique, block_unique, one_hot_blocks_unique
from dlrmtrain.comm.dedup.plan import DedupPlan, DedupStep
from dlrmtrain.comm.layout import DistLayout, FeatureEntry

Grid = list[list[BlockUnique | None]]
"""BlockUnique per (entry, block); None for a table sent in full"""


@dataclass
class _Blocks:
    """One step's unique bags of both ends and, after the host sync, their counts."""

    owner: Grid
    """[local entry][sample rank]: the bags this rank sends rows for"""
    sample: Grid
    """[entry of the all-to-all][0]: this rank's own bags"""
    counts: dict[tuple[int, int, int], int] = field(default_factory=dict)
    """(id(grid), entry, block) -> unique bags"""

    def count(self, grid: Grid, i: int, b: int, size: int) -> int:
        """Rows block (i, b) of `grid` puts on the wire: its unique bags, or all `size` bags sent in full."""
        return size if grid[i][b] is None else self.counts[(id(grid), i, b)]


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
                 starts: list[int], sizes: list[int], widths: list[list[int]]) -> Grid:
        """BlockUnique per (entry, block); None for tables sent in full.

        Blocks whose key width is 1 (one-hot so far) share one batched sort;
        wider (multi-hot) blocks are keyed one by one.
        """
        lengths, offsets, values = kjt.lengths(), kjt.offsets(), kjt.values()
        result: Grid = [[None] * len(starts) for _ in entries]
        batched = []
        for i, entry in enumerate(entries):
            if entry.table not in self.dedup_tables:
                continue
            for b, (start, size) in enumerate(zip(starts, sizes)):
                g0 = i * stride + start
                if widths[i][b] == 1:
                    batched.append((i, b, g0, size, entry.num_embeddings))
                else:
                    result[i][b] = block_unique(values, offsets[g0:g0 + size], lengths[g0:g0 + size],
                                                widths[i][b], entry.num_embeddings)
        if batched:
            uniques = one_hot_blocks_unique(values, offsets, lengths, [g for _, _, g, _, _ in batched],
                                            [n for _, _, _, n, _ in batched], [e for *_, e in batched])
            for (i, b, *_), u in zip(batched, uniques):
                result[i][b] = u
        return result

    def _read_counts(self, blocks: list[BlockUnique]) -> tuple[list[int], list[bool], list[bool]]:
        """The host sync: counts and flags of all blocks in one transfer."""
        if not blocks:
            return [], [], []
        flat = torch.stack([torch.stack([b.count, b.overflow.long(), b.bad_ids.long()]) for b in blocks])
        counts, overflow, bad = zip(*flat.tolist())
        return list(counts), [bool(o) for o in overflow], [bool(x) for x in bad]

    def plan(self, step: DedupStep) -> DedupPlan:
        sizes, B, starts = step.sizes, step.batch, step.starts
        blocks = _Blocks(
            owner=self._uniques(step.owner_kjt, self.local_entries, step.global_batch, starts, sizes,
                                self._owner_widths),
            sample=self._uniques(step.sample_kjt, self.all_entries, B, [0], [B],
                                 [[w] for w in self._sample_widths]))
        owner, sample = blocks.owner, blocks.sample

        # one host sync for every block of both ends; a retry only if a bag outgrew its key width
        for attempt in range(2):
            slots = [(grid, i, b) for grid in (owner, sample) for i, row in enumerate(grid)
                     for b, u in enumerate(row) if u is not None]
            counts, overflow, bad = self._read_counts([grid[i][b] for grid, i, b in slots])
            for (grid, i, b), is_bad in zip(slots, bad):
                if is_bad:
                    entry = (self.local_entries if grid is owner else self.all_entries)[i]
                    raise ValueError(f"feature {entry.feature!r} (table {entry.table!r}): ids outside "
                                     f"[0, {entry.num_embeddings}) reached the dedup codec")
            if not any(overflow):
                break
            assert attempt == 0, "key width still too small after widening"
            step.stats.extra_syncs += 1
            self._widen(step, blocks, slots, overflow)
        blocks.counts = {(id(grid), i, b): c for (grid, i, b), c in zip(slots, counts)}

        plan = self._build_plan(step, blocks)
        self._account(step, blocks)
        return plan

    def _widen(self, step: DedupStep, blocks: _Blocks, slots: list[tuple[Grid, int, int]],
               overflow: list[bool]) -> None:
        """Grow the key width of overflowing blocks to their longest bag and redo them."""
        todo = []
        starts, B = step.starts, step.batch
        for (grid, i, b), over in zip(slots, overflow):
            if not over:
                continue
            if grid is blocks.owner:
                todo.append((grid, i, b, step.owner_kjt, i * step.global_batch + starts[b], step.sizes[b],
                             self.local_entries[i]))
            else:
                todo.append((grid, i, b, step.sample_kjt, i * B, B, self.all_entries[i]))
        # the extra host sync (counted in extra_syncs): every overflowing block's longest bag at once
        longest = torch.stack([kjt.lengths()[g0:g0 + n].max() for _, _, _, kjt, g0, n, _ in todo]).tolist()
        for (grid, i, b, kjt, g0, n, entry), width in zip(todo, longest):
            if grid is blocks.owner:
                self._owner_widths[i][b] = width
            else:
                self._sample_widths[i] = width
            grid[i][b] = block_unique(kjt.values(), kjt.offsets()[g0:g0 + n], kjt.lengths()[g0:g0 + n],
                                      width, entry.num_embeddings)

    def _build_plan(self, step: DedupStep, blocks: _Blocks) -> DedupPlan:
        unit, W = self.unit, self.world_size
        owner, sample, count = blocks.owner, blocks.sample, blocks.count
        sizes, B, starts = step.sizes, step.batch, step.starts
        device = self.pg_device(owner, sample)
        # owner: message to rank s = its local entries in order, unique rows of each
        local_units = sum(e.dim for e in self.local_entries) // unit
        col_units = [0]
        for e in self.local_entries:
            col_units.append(col_units[-1] + e.dim // unit)
        send_parts, send_splits = [], []
        for s in range(W):
            elems = 0
            for i, entry in enumerate(self.local_entries):
                d = entry.dim // unit
                n = count(owner, i, s, sizes[s])
                u = owner[i][s]
                first = torch.arange(n, device=device) if u is None else u.first[:n]
                rows = (starts[s] + first).unsqueeze(1) * local_units + col_units[i]
                send_parts.append((rows + torch.arange(d, device=device)).reshape(-1))
                elems += n * entry.dim
            send_splits.append(elems)
        # receiver: output unit (b, column) <- receive-buffer unit of bag b's unique row
        recv_parts, recv_splits, unit_offset = [], [], 0
        j = 0
        for r in range(W):
            elems = 0
            for entry in self.layout.entries_per_rank[r]:
                d = entry.dim // unit
                n = count(sample, j, 0, B)
                u = sample[j][0]
                inverse = torch.arange(B, device=device) if u is None else u.inverse
                recv_parts.append(unit_offset + inverse.unsqueeze(1) * d + torch.arange(d, device=device))
                unit_offset += n * d
                elems += n * entry.dim
                j += 1
            recv_splits.append(elems)
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        send_index = torch.cat(send_parts) if send_parts else empty
        recv_index = torch.cat(recv_parts, dim=1).reshape(-1) if recv_parts else empty
        out_dim = sum(e.dim for e in self.all_entries)
        return DedupPlan(unit, send_index, recv_index, send_splits, recv_splits, (B, out_dim))

    @staticmethod
    def pg_device(owner: Grid, sample: Grid) -> torch.device:
        for grid in (owner, sample):
            for row in grid:
                for u in row:
                    if u is not None:
                        return u.inverse.device
        return torch.device("cpu")

    def _account(self, step: DedupStep, blocks: _Blocks) -> None:
        """Add this step's bytes to the per-table counters (host integers only).

        `elem` is the embedding's element size (what `none` sends); the payload
        travels at `wire` bytes per value.
        """
        stats, wire, elem = step.stats, step.wire_bytes, step.elem_bytes
        owner, sample, count = blocks.owner, blocks.sample, blocks.count
        owner_kjt, sample_kjt, sizes, B = step.owner_kjt, step.sample_kjt, step.sizes, step.batch
        owner_lengths = owner_kjt.length_per_key() if self.local_entries else []
        for i, entry in enumerate(self.local_entries):
            t = stats.table(entry.table)
            for s in range(self.world_size):
                t.add_rows(entry.dim, wire, elem, sent=count(owner, i, s, sizes[s]), stock_sent=sizes[s])
            t.id_recv_bytes += (owner_lengths[i] * owner_kjt.values().element_size()
                                + sum(sizes) * owner_kjt.lengths().element_size())
        sample_lengths = sample_kjt.length_per_key() if self.all_entries else []
        for j, entry in enumerate(self.all_entries):
            t = stats.table(entry.table)
            t.add_rows(entry.dim, wire, elem, received=count(sample, j, 0, B), stock_received=B, bags=B)
            t.id_sent_bytes += (sample_lengths[j] * sample_kjt.values().element_size()
                                + B * sample_kjt.lengths().element_size())
