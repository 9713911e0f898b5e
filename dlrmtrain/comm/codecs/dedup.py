"""The lossless dedup codec: only distinct pooled rows cross the all-to-all.

For every (feature, sample-rank) block, the owner (ids from the input
all-to-all) and the sample rank (its own ids) compute the same unique bags
(DESIGN.md §4). Forward: the owner sends one row per unique bag, the receiver
expands with its inverse. Backward: the receiver segment-sums the gradient per
unique bag and sends that; the owner writes each sum at the bag's first
occurrence (zeros elsewhere), which the fused embedding backward turns into the
same row update as the uncompressed gradient, up to float summation order.
Gradients are divided by the world size like TorchRec's all-to-all backward.

Stacked with a lossy wire precision (`dedup+fp16`, `dedup+bf16`, LOSSY): the
unique rows, and backward their gradient sums, cross the wire rounded by the
same fbgemm casts TorchRec's qcomms use, so the forward equals that of `fp16` /
`bf16` alone bitwise and the bytes are the product of both savings.

Host syncs: one per dist per step (all blocks' unique counts in one `.tolist()`),
plus one more only when a bag is longer than the key width learned so far.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.embedding_sharding import EmbeddingShardingContext
from torchrec.distributed.types import Awaitable
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.buffers import BufferPool
from dlrmtrain.comm.codecs.dedup_comm import DedupPlan, start_dedup_all_to_all
from dlrmtrain.comm.codecs.dedup_kernels import BlockUnique, block_unique, one_hot_blocks_unique
from dlrmtrain.comm.layout import DistLayout, FeatureEntry
from dlrmtrain.comm.stats import DistCommStats

OWNER_FEATURES = "dlrmtrain_owner_features"
"""sharding-context attribute: the KJT the owner looked up (after the id all-to-all)"""
SAMPLE_FEATURES = "dlrmtrain_sample_features"
"""sharding-context attribute: this rank's own KJT slice (before the id all-to-all)"""


class DedupPooledEmbeddingDist(nn.Module):
    """Drop-in for TorchRec's `TwPooledEmbeddingDist` (table-/column-wise) with dedup.

    `dedup_tables` selects the tables whose blocks are deduplicated; the other
    tables of the same all-to-all travel in full (codec `none` per table).
    """

    def __init__(self, stock_dist: nn.Module, layout: DistLayout, dedup_tables: set[str],
                 pg: dist.ProcessGroup, sharding_type: str, wire_dtype: torch.dtype | None = None,
                 codec_name: str = "dedup") -> None:
        super().__init__()
        self.wire_dtype = wire_dtype
        self.pg = pg
        self.rank = dist.get_rank(pg)
        self.world_size = dist.get_world_size(pg)
        # CW sharding reorders shards with a callback; keep it (it is differentiable)
        self._callbacks = list(getattr(stock_dist, "_callbacks", None) or [])
        self.layout = layout
        self.local_entries = layout.entries_per_rank[self.rank]
        self.all_entries = layout.all_entries()
        self.dedup_tables = dedup_tables
        plain = sorted({e.table for e in self.all_entries} - dedup_tables)
        if wire_dtype is not None and plain:
            raise ValueError(f"comm.table_codecs: tables {plain} are 'none' but share an all-to-all with "
                             f"{codec_name!r} tables, whose lossy wire precision covers the whole message; "
                             f"give them the same codec or shard them apart")
        dims = [e.dim for e in self.all_entries]
        self.unit = math.gcd(*dims) if dims else 1
        # learned key widths (longest bag so far), one per block; both ends of a
        # block see the same ids, so they update them identically
        self._owner_widths = [[1] * self.world_size for _ in self.local_entries]
        self._sample_widths = [1] * len(self.all_entries)
        self.output_pool = BufferPool()  # expanded outputs (forward)
        self.grad_pool = BufferPool()    # embedding gradients (backward)
        self.comm_stats = DistCommStats(
            codec=codec_name, sharding_type=sharding_type,
            table_codecs={e.table: codec_name if e.table in dedup_tables else "none" for e in self.all_entries})

    # ------------------------------------------------------------------ forward
    def forward(self, local_embs: torch.Tensor,
                sharding_ctx: EmbeddingShardingContext | None = None) -> Awaitable[torch.Tensor]:
        owner_kjt = getattr(sharding_ctx, OWNER_FEATURES, None)
        sample_kjt = getattr(sharding_ctx, SAMPLE_FEATURES, None)
        if owner_kjt is None or sample_kjt is None:
            raise RuntimeError(
                "dedup output dist needs the ids of both ends; it is driven by "
                "CodecShardedEmbeddingBagCollection.compute[_and_output_dist] before output_dist")
        if sharding_ctx.variable_batch_per_feature:
            raise NotImplementedError("dedup codec: variable batch size per feature is not supported")
        plan = self._plan(owner_kjt, sample_kjt, list(sharding_ctx.batch_size_per_rank)
                          or [sample_kjt.stride()] * self.world_size, local_embs.element_size())
        awaitable = start_dedup_all_to_all(local_embs, plan, self)
        awaitable.callbacks.extend(self._callbacks)
        return awaitable

    # --------------------------------------------------------------------- plan
    def _uniques(self, kjt: KeyedJaggedTensor, entries: list[FeatureEntry], stride: int,
                 starts: list[int], sizes: list[int], widths: list[list[int]]) -> list[list[BlockUnique | None]]:
        """BlockUnique per (entry, block); None for tables sent in full.

        Blocks whose key width is 1 (one-hot so far) share one batched sort;
        wider (multi-hot) blocks are keyed one by one.
        """
        lengths, offsets, values = kjt.lengths(), kjt.offsets(), kjt.values()
        result: list[list[BlockUnique | None]] = [[None] * len(starts) for _ in entries]
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

    def _plan(self, owner_kjt: KeyedJaggedTensor, sample_kjt: KeyedJaggedTensor,
              batch_size_per_rank: list[int], elem_size: int) -> DedupPlan:
        t0 = time.perf_counter()
        W, B = self.world_size, batch_size_per_rank[self.rank]
        starts = [sum(batch_size_per_rank[:s]) for s in range(W)]
        owner_stride = sum(batch_size_per_rank)
        sample_widths = [[w] for w in self._sample_widths]
        owner = self._uniques(owner_kjt, self.local_entries, owner_stride, starts,
                              batch_size_per_rank, self._owner_widths)
        sample = self._uniques(sample_kjt, self.all_entries, B, [0], [B], sample_widths)

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
            self.comm_stats.extra_syncs += 1
            self._widen(owner, sample, slots, overflow, owner_kjt, sample_kjt, owner_stride, starts,
                        batch_size_per_rank, B, sample_widths)
        count_of = {(id(grid), i, b): c for (grid, i, b), c in zip(slots, counts)}

        def count(grid, i, b, size):
            return size if grid[i][b] is None else count_of[(id(grid), i, b)]

        plan = self._build_plan(owner, sample, count, batch_size_per_rank, B, starts)
        self._account(owner, sample, count, owner_kjt, sample_kjt, batch_size_per_rank, B, elem_size)
        self.comm_stats.codec_seconds += time.perf_counter() - t0
        self.comm_stats.steps += 1
        return plan

    def _widen(self, owner, sample, slots, overflow, owner_kjt, sample_kjt, owner_stride, starts,
               sizes, B, sample_widths) -> None:
        """Grow the key width of overflowing blocks to their longest bag and redo them."""
        todo = []
        for (grid, i, b), over in zip(slots, overflow):
            if not over:
                continue
            if grid is owner:
                todo.append((grid, i, b, owner_kjt, i * owner_stride + starts[b], sizes[b], self.local_entries[i]))
            else:
                todo.append((grid, i, b, sample_kjt, i * B, B, self.all_entries[i]))
        # the extra host sync (counted in extra_syncs): every overflowing block's longest bag at once
        longest = torch.stack([kjt.lengths()[g0:g0 + n].max() for _, _, _, kjt, g0, n, _ in todo]).tolist()
        for (grid, i, b, kjt, g0, n, entry), width in zip(todo, longest):
            if grid is owner:
                self._owner_widths[i][b] = width
            else:
                self._sample_widths[i] = sample_widths[i][0] = width
            grid[i][b] = block_unique(kjt.values(), kjt.offsets()[g0:g0 + n], kjt.lengths()[g0:g0 + n],
                                      width, entry.num_embeddings)

    def _build_plan(self, owner, sample, count, sizes, B, starts) -> DedupPlan:
        unit, W = self.unit, self.world_size
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
    def pg_device(owner, sample) -> torch.device:
        for grid in (owner, sample):
            for row in grid:
                for u in row:
                    if u is not None:
                        return u.inverse.device
        return torch.device("cpu")

    def _account(self, owner, sample, count, owner_kjt, sample_kjt, sizes, B, elem) -> None:
        """Add this step's bytes to the per-table counters (host integers only).

        `elem` is the embedding's element size (what `none` sends); the payload
        travels at the wire precision's.
        """
        stats = self.comm_stats
        wire = torch.empty(0, dtype=self.wire_dtype).element_size() if self.wire_dtype else elem
        owner_lengths = owner_kjt.length_per_key() if self.local_entries else []
        for i, entry in enumerate(self.local_entries):
            t = stats.table(entry.table)
            for s in range(self.world_size):
                sent = count(owner, i, s, sizes[s]) * entry.dim * wire
                t.payload_fwd_sent_bytes += sent
                t.payload_bwd_recv_bytes += sent
                t.uncompressed_fwd_sent_bytes += sizes[s] * entry.dim * elem
            t.id_recv_bytes += (owner_lengths[i] * owner_kjt.values().element_size()
                                + sum(sizes) * owner_kjt.lengths().element_size())
        sample_lengths = sample_kjt.length_per_key() if self.all_entries else []
        for j, entry in enumerate(self.all_entries):
            t = stats.table(entry.table)
            n = count(sample, j, 0, B)
            t.bags += B
            t.unique_bags += n
            t.payload_fwd_recv_bytes += n * entry.dim * wire
            t.payload_bwd_sent_bytes += n * entry.dim * wire
            t.uncompressed_fwd_recv_bytes += B * entry.dim * elem
            t.id_sent_bytes += (sample_lengths[j] * sample_kjt.values().element_size()
                                + B * sample_kjt.lengths().element_size())


class DedupCodec:
    """Registry entry: builds `DedupPooledEmbeddingDist` for table- and column-wise shardings.

    With `wire_dtype` (fp16 / bf16) it is the stacked, LOSSY `dedup+fp16` / `dedup+bf16`.
    """

    # table-/column-wise: TorchRec's TwPooledEmbeddingDist; row-wise: its reduce-scatter, replaced
    # by an all-to-all of unique rows (dedup_rw.py); table-row-wise: not supported (falls back to none)
    SHARDING_TYPES = frozenset({"table_wise", "column_wise", "table_column_wise", "row_wise"})
    _WIRE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    needs_ids = True  # both ends' KJTs, recorded by the sharder; per-id weights unsupported

    def __init__(self, wire_dtype: torch.dtype | None = None) -> None:
        self.wire_dtype = wire_dtype
        self.name = "dedup" if wire_dtype is None else f"dedup+{self._WIRE_NAMES[wire_dtype]}"
        self.lossless = wire_dtype is None

    def supports(self, sharding_type: str) -> bool:
        return sharding_type in self.SHARDING_TYPES

    def make_output_dist(self, stock_dist: nn.Module, layout: DistLayout, tables: set[str],
                         pg: dist.ProcessGroup, sharding_type: str) -> nn.Module:
        if sharding_type == "row_wise":
            from dlrmtrain.comm.codecs.dedup_rw import RowWiseDedupDist  # it builds on this module

            plain = sorted({e.table for e in layout.entries} - tables)
            if plain:
                raise ValueError(f"comm.table_codecs: row-wise tables {plain} are 'none' but share the "
                                 f"reduce-scatter of {self.name!r} tables {sorted(tables)}; give all "
                                 f"row-wise tables the same codec")
            return RowWiseDedupDist(stock_dist, layout, pg, wire_dtype=self.wire_dtype, codec_name=self.name)
        return DedupPooledEmbeddingDist(stock_dist, layout, tables, pg, sharding_type,
                                        wire_dtype=self.wire_dtype, codec_name=self.name)
