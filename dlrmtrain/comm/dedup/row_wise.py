"""dedup for row-wise sharding: an all-to-all of unique rows instead of a reduce-scatter.

The planner of `DedupDist` (dist.py) for row-wise tables.

TorchRec's row-wise dist reduce-scatters [B_global, D] partial sums: each rank
looked up the ids in its row block and contributes zeros for the others. With
one id per bag, exactly one rank (id // block) holds each bag's row, so the sum
only adds zeros: the sample rank can instead receive, from each row shard, the
distinct rows of the ids that shard holds, and pick each bag's row from the
shard its id names (empty bags: zeros). Both ends rank the same ids with the
same sort — key (shard, feature, id) — so no index or size crosses the wire,
and the forward is bitwise that of the reduce-scatter (x + 0 = x).

A bag with several ids may span shards and then needs the sum: whenever any
rank sees such a bag (or an out-of-range id), every rank learns it from one
small all-reduce of the sample ranks' flags, launched when the ids leave for
the id all-to-all (`start_row_flags`, from `DedupDist.start_with_ids`; the
plan itself issues no collective) and read in the step's single host sync,
and that step runs TorchRec's stock reduce-scatter (logged once, by
`DedupDist`), so a result is never wrong. The sample ranks' bags decide it:
an owner's bag piece of several ids, or an id outside its row block, is a
piece of a sample rank's bag of several ids, or of a bad id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.dedup.kernels import expand_units, host_to_device, segment_units, sorted_unique_one_hot
from dlrmtrain.comm.dedup.plan import DedupPlan, DedupStep
from dlrmtrain.comm.layout import RowWiseLayout


@dataclass
class RowFlags:
    """[multi-id bag, bad id] seen on any rank: a MAX all-reduce in flight (`start_row_flags`)."""

    work: Any
    flags: torch.Tensor

    def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.flags


def _bag_ids(kjt: KeyedJaggedTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per bag (feature-major): its first id, whether it has exactly one, whether more."""
    lengths, offsets, values = kjt.lengths(), kjt.offsets()[:-1], kjt.values()
    if values.numel() == 0:
        return torch.zeros_like(lengths, dtype=torch.int64), lengths > 1, lengths > 1
    ids = values[offsets.clamp(max=values.numel() - 1)].to(torch.int64)
    return ids, lengths == 1, lengths > 1


def _sample_shards(kjt: KeyedJaggedTensor, layout: RowWiseLayout):
    """The sample rank's bags: (ids, one id, several ids, feature, row shard, bad id) per bag."""
    F, W, device = len(layout.entries), layout.world_size, kjt.lengths().device
    ids, valid, multi = _bag_ids(kjt)
    feature = torch.arange(F, device=device).repeat_interleave(kjt.stride())
    blocks = host_to_device(layout.block_sizes, device)
    shard = torch.div(ids, blocks[feature], rounding_mode="floor")
    bad = valid & ((ids < 0) | (shard >= W) | (ids >= host_to_device(
        [e.num_embeddings for e in layout.entries], device)[feature]))
    return ids, valid, multi, feature, shard, bad


def start_row_flags(sample_kjt: KeyedJaggedTensor, layout: RowWiseLayout, pg: dist.ProcessGroup) -> RowFlags:
    """Launch the MAX all-reduce of this sample rank's [multi-id bag, bad id] flags over `pg`
    (no host sync: it is read with the plan's counts)."""
    _, _, multi, _, _, bad = _sample_shards(sample_kjt, layout)
    flags = torch.stack([multi.any(), bad.any()]).long()
    return RowFlags(dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=pg, async_op=True), flags)


def agreed_flags(step: DedupStep) -> torch.Tensor:
    """The step's flags all-reduced over the world, launched with its ids (the plan waits, never launches)."""
    if not isinstance(step.started_with_ids, RowFlags):
        raise RuntimeError("row-wise dedup: the multi-id flags are launched with the ids "
                           "(IdRecordingShardedEBC.input_dist -> DedupDist.start_with_ids); this pass had none")
    return step.started_with_ids.wait()


@dataclass
class _Uniques:
    """One step's distinct rows of both ends, ranked by the same sort, and their counts per group."""

    o_first: torch.Tensor
    """owner: per unique row (key (dest rank, feature, id)), its first bag (feature-major)"""
    s_uid: torch.Tensor
    """sample rank: per bag (feature-major), its unique row (key (row shard, feature, id in shard))"""
    s_group: torch.Tensor
    """sample rank: per bag, its group shard·F + feature"""
    send_counts: list[int]
    """owner: unique rows per (dest rank, feature)"""
    recv_counts: list[int]
    """sample rank: unique rows per (row shard, feature)"""


def owner_send_index(o_first: torch.Tensor, counts: list[int], destinations: int, d_units: list[int],
                     global_batch: int, unit: int) -> tuple[torch.Tensor, list[int]]:
    """The owner's send index and splits (elements per destination): unique u of group
    (destination, feature i), in that order, is bag o_first[u] = i·global_batch + row; its units,
    from one `segment_units` call (no op per (destination, feature))."""
    F, local_units = len(d_units), sum(d_units)
    col_units = [sum(d_units[:i]) for i in range(F)]
    segments, send_splits, u0 = [], [], 0  # (first unique, uniques, unit added, units per row)
    for dest in range(destinations):
        elems = 0
        for i in range(F):
            n = counts[dest * F + i]
            segments.append((u0, n, col_units[i] - i * global_batch * local_units, d_units[i]))
            u0 += n
            elems += n * d_units[i] * unit
        send_splits.append(elems)
    return segment_units(o_first, segments, local_units), send_splits


class RowBlockPlanner:
    """What both row-wise planners (one level, two levels) take from the layout, and their first move."""

    def __init__(self, layout: RowWiseLayout, pg: dist.ProcessGroup) -> None:
        self.pg = pg  # the world: every rank must agree on falling back (the flags' all-reduce)
        self.layout = layout
        self.world_size = layout.world_size
        self.entries = layout.entries
        self.block_sizes = layout.block_sizes
        dims = [e.dim for e in self.entries]
        self.unit = math.gcd(*dims) if dims else 1
        self.radix = max(self.block_sizes + [1])

    def start_with_ids(self, sample_kjt: KeyedJaggedTensor) -> RowFlags:
        """Every rank must take the same path: the flags' all-reduce leaves with the ids, never from the plan."""
        return start_row_flags(sample_kjt, self.layout, self.pg)


class RowWisePlanner(RowBlockPlanner):
    """Plans the unique-row all-to-all that replaces TorchRec's `RwPooledEmbeddingDist` (one-hot features)."""

    fallback_warning = ("row-wise dedup: a bag holds several ids (it may span row shards and need the sum); "
                        "such steps use TorchRec's reduce-scatter (codec none)")

    def __init__(self, layout: RowWiseLayout, pg: dist.ProcessGroup, rank: int) -> None:
        super().__init__(layout, pg)
        self.rank = rank

    # ------------------------------------------------------------------ plan

    def plan(self, step: DedupStep) -> DedupPlan | None:
        W, F = self.world_size, len(self.entries)
        owner_kjt, sample_kjt, sizes = step.owner_kjt, step.sample_kjt, step.sizes
        B_global, device = step.global_batch, step.device
        blocks = host_to_device(self.block_sizes, device)
        # owner: bags of all ranks, ids local to this rank's row block; key (dest rank, feature, id)
        o_ids, o_valid, _ = _bag_ids(owner_kjt)
        o_feature = torch.arange(F, device=device).repeat_interleave(B_global)
        o_dest = torch.bucketize(torch.arange(B_global, device=device),
                                 host_to_device(sizes, device).cumsum(0), right=True).repeat(F)
        o_bad = o_valid & ((o_ids < 0) | (o_ids >= blocks[o_feature]))
        o_uid, o_first, o_counts = sorted_unique_one_hot(o_dest * F + o_feature, o_ids, o_valid & ~o_bad,
                                                         W * F, self.radix)
        # sample rank: own bags, global ids; key (row shard, feature, id within the shard)
        s_ids, s_valid, _, s_feature, s_shard, s_bad = _sample_shards(sample_kjt, self.layout)
        s_local = s_ids - s_shard * blocks[s_feature]
        s_group = s_shard * F + s_feature
        s_uid, _, s_counts = sorted_unique_one_hot(s_group, s_local, s_valid & ~s_bad,
                                                   W * F, self.radix)
        # every rank takes the same path: "multi-id bag or bad id seen anywhere", agreed with the ids
        host = torch.cat([agreed_flags(step), o_counts, s_counts]).tolist()  # the one host sync
        multi, bad = host[0], host[1]
        if bad:
            raise ValueError(f"row-wise dedup (tables {sorted({e.table for e in self.entries})}): "
                             f"ids outside their table reached the codec")
        if multi:
            return None
        uniques = _Uniques(o_first, s_uid, s_group, send_counts=host[2:2 + W * F], recv_counts=host[2 + W * F:])
        plan = self._build(step, uniques)
        self._account(step, uniques)
        return plan

    def _build(self, step: DedupStep, uniques: _Uniques) -> DedupPlan:
        W, F, unit = self.world_size, len(self.entries), self.unit
        B, B_global, device = step.batch, step.global_batch, step.device
        o_first, s_uid, s_group = uniques.o_first, uniques.s_uid, uniques.s_group
        send_counts, recv_counts = uniques.send_counts, uniques.recv_counts
        d_units = [e.dim // unit for e in self.entries]
        local_units = sum(d_units)
        send_index, send_splits = owner_send_index(o_first, send_counts, W, d_units, B_global, unit)
        # receiver: units of unique u start at base[group] + (u - first uid of group)·d
        base_units, first_uid, recv_splits, unit_off, uid_off = [], [], [], 0, 0
        for r in range(W):
            elems = 0
            for i in range(F):
                n = recv_counts[r * F + i]
                base_units.append(unit_off)
                first_uid.append(uid_off)
                unit_off += n * d_units[i]
                uid_off += n
                elems += n * d_units[i] * unit
            recv_splits.append(elems)
        zero_unit = unit_off  # one all-zero row after the message: empty bags point there
        base_t = host_to_device(base_units + [zero_unit], device)
        first_t = host_to_device(first_uid + [uid_off], device)
        # every feature's bags at once: [F, B] of each bag's first unit, then one column per unit
        uid = s_uid.view(F, B)
        valid = uid < uid_off  # empty (or missing) bags → the zero row
        group = torch.where(valid, s_group.view(F, B), W * F)
        d_t = host_to_device(d_units, device).unsqueeze(1)
        start = torch.where(valid, base_t[group] + (uid - first_t[group]) * d_t, zero_unit)
        recv_index = expand_units(start, [(i, 1, k) for i in range(F) for k in range(d_units[i])])
        return DedupPlan(unit, send_index, recv_index, send_splits, recv_splits,
                         (B, local_units * unit), pad_units=max(d_units, default=0))

    def _account(self, step: DedupStep, uniques: _Uniques) -> None:
        """This step's bytes per table (host integers only)."""
        W, F = self.world_size, len(self.entries)
        stats, wire, elem, sizes, B = step.stats, step.wire_bytes, step.elem_bytes, step.sizes, step.batch
        send_counts, recv_counts = uniques.send_counts, uniques.recv_counts
        owner_kjt, sample_kjt = step.owner_kjt, step.sample_kjt
        owner_values = owner_kjt.length_per_key()
        sample_values = sample_kjt.length_per_key()
        for i, e in enumerate(self.entries):
            t = stats.table(e.table)
            for r in range(W):
                # the reduce-scatter sends this rank's partial sums of every sample rank's bags
                t.add_rows(e.dim, wire, elem, sent=send_counts[r * F + i], received=recv_counts[r * F + i],
                           stock_sent=sizes[r])
            # id all-to-all: each bag's ids go to their shard; every shard gets every bag's length
            t.id_sent_bytes += (sample_values[i] * sample_kjt.values().element_size()
                                + W * B * sample_kjt.lengths().element_size())
            t.id_recv_bytes += (owner_values[i] * owner_kjt.values().element_size()
                                + sum(sizes) * owner_kjt.lengths().element_size())
            # ... and receives every rank's partial sums of its own B bags
            t.add_rows(e.dim, wire, elem, stock_received=W * B, bags=B)
