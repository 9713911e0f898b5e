"""Two-level dedup for row-wise tables (`comm.hierarchy: node`): the row-wise twin of table_wise.py.

Row-wise, every rank holds a row block of every feature's table, and one-level
dedup replaces TorchRec's reduce-scatter by an all-to-all of distinct rows
(row_wise.py). In two levels, row shard o = (node m, local l) sends each
destination node n, over its rail, the distinct (feature, id) of node n's bags
that fall in its block (key (node, feature, id)); the forwarder p = (n, l)
computes the same set from its node's ids (exchanged inside the node,
node_ids.py) for every shard of its rail (key (shard's node, feature,
id)) and sends each rank r of its node the rows r's bags use, in that order,
which is r's own order (key (shard, feature, id), as one-level row-wise).
Empty bags read a zero row after the message. Forward bitwise equal to the
reduce-scatter (x + 0 = x).

A bag with several ids may span shards and needs the sum: as one-level
row-wise, a step where any rank sees one (a MAX all-reduce of the flags,
launched with the ids and read in the exchange's host sync) runs TorchRec's
reduce-scatter on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.dedup.kernels import host_to_device, sorted_unique_one_hot
from dlrmtrain.comm.dedup.plan import DedupStep
from dlrmtrain.comm.dedup.row_wise import RowBlockPlanner, agreed_flags, owner_send_index
from dlrmtrain.comm.dedup.two_level.node_ids import NodeExchange, exchange_node_ids
from dlrmtrain.comm.dedup.two_level.shared import TwoLevelPlan, cat_or_empty, unit_rows
from dlrmtrain.comm.layout import RowWiseLayout
from dlrmtrain.comm.topology import NodeGroups, NodeTopology


def _first_ids(lengths: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor):
    """Per bag: its first id (0 when empty), whether it holds exactly one id, whether more."""
    if values.numel() == 0:
        return torch.zeros_like(lengths, dtype=torch.int64), lengths > 1, lengths > 1
    ids = values[offsets.clamp(max=values.numel() - 1)].to(torch.int64)
    return ids, lengths == 1, lengths > 1


def _bags(kjt: KeyedJaggedTensor):
    return _first_ids(kjt.lengths(), kjt.offsets()[:-1], kjt.values())


class TwoLevelRowWisePlanner(RowBlockPlanner):
    """Plans the two-level exchange that replaces TorchRec's row-wise reduce-scatter (one-hot steps)."""

    fallback_warning = ("row-wise two-level dedup: a bag holds several ids (it may span row shards and need "
                        "the sum); such steps use TorchRec's reduce-scatter (codec none)")

    def __init__(self, layout: RowWiseLayout, topology: NodeTopology, groups: NodeGroups,
                 pg: dist.ProcessGroup) -> None:
        super().__init__(layout, pg)
        self.topology = topology
        self.groups = groups
        # every rank of a node forwards rows of every feature (each rail holds a row block of all)
        self.all_features = [list(range(len(self.entries)))] * topology.ranks_per_node

    def plan(self, step: DedupStep) -> TwoLevelPlan | None:
        topo, F = self.topology, len(self.entries)
        L, N = topo.ranks_per_node, topo.nodes
        blocks = host_to_device(self.block_sizes, step.device)
        o_first, o_counts = self._owner_keys(step, blocks)
        s_uid, s_group, s_counts = self._sample_keys(step, blocks)
        # the flags every rank agrees on, launched with the ids (row_wise.start_row_flags), are read
        # in the id exchange's host sync
        ex = exchange_node_ids(step, topo, self.groups, self.all_features, extra=agreed_flags(step)).wait()
        multi, bad = ex.extra
        if bad:
            raise ValueError(f"row-wise dedup (tables {sorted({e.table for e in self.entries})}): "
                             f"ids outside their table reached the codec")
        if multi:
            return None
        chosen, p_counts, sub_counts = self._forwarder_keys(step, ex, blocks)

        host = torch.cat([o_counts, p_counts, sub_counts.view(-1), s_counts]).tolist()  # the second host sync
        o_n, p_n, sub_n = N * F, N * F, L * N * F
        counts = {"owner": host[:o_n], "fwd": host[o_n:o_n + p_n],
                  "sub": [host[o_n + p_n + k * N * F:o_n + p_n + (k + 1) * N * F] for k in range(L)],
                  "own": host[o_n + p_n + sub_n:]}
        plan = self._build(step, o_first, counts, chosen, s_uid, s_group)
        self._account(step, ex, counts)
        return plan

    def _owner_keys(self, step: DedupStep, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Owner: every node's bags with ids in this rank's row block; key (destination node,
        feature, id). Returns (first occurrence of each unique key, counts per group)."""
        topo, F = self.topology, len(self.entries)
        L, N = topo.ranks_per_node, topo.nodes
        sizes, starts, GB, device = step.sizes, step.starts, step.global_batch, step.device
        o_ids, o_valid, _ = _bags(step.owner_kjt)
        o_feature = torch.arange(F, device=device).repeat_interleave(GB)
        node_ends = host_to_device([starts[n * L] + sum(sizes[n * L:(n + 1) * L]) for n in range(N)], device)
        o_node = torch.bucketize(torch.arange(GB, device=device), node_ends, right=True).repeat(F)
        o_bad = o_valid & ((o_ids < 0) | (o_ids >= blocks[o_feature]))
        _, o_first, o_counts = sorted_unique_one_hot(o_node * F + o_feature, o_ids, o_valid & ~o_bad,
                                                     N * F, self.radix)
        return o_first, o_counts

    def _sample_keys(self, step: DedupStep, blocks: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample rank: its own bags, key (row shard, feature, id in the shard), as one-level
        row-wise. Returns (unique key of each bag, its group, counts per group)."""
        W, F, B, device = self.world_size, len(self.entries), step.batch, step.device
        s_ids, s_valid, _ = _bags(step.sample_kjt)
        s_feature = torch.arange(F, device=device).repeat_interleave(B)
        s_shard = torch.div(s_ids, blocks[s_feature], rounding_mode="floor")
        s_bad = s_valid & ((s_ids < 0) | (s_shard >= W) | (s_ids >= host_to_device(
            [e.num_embeddings for e in self.entries], device)[s_feature]))
        s_group = s_shard * F + s_feature
        s_uid, _, s_counts = sorted_unique_one_hot(s_group, s_ids - s_shard * blocks[s_feature],
                                                   s_valid & ~s_bad, W * F, self.radix)
        return s_uid, s_group, s_counts

    def _forwarder_keys(self, step: DedupStep, ex, blocks: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forwarder: the node's bags (from the id exchange `ex`) in the row blocks of its rail;
        key (shard's node, feature, id). Returns (the unique keys each rank of the node uses,
        in order, per rank), counts per group, and those counts per rank of the node."""
        topo, F, device, sizes = self.topology, len(self.entries), step.device, step.sizes
        L, N = topo.ranks_per_node, topo.nodes
        node = topo.node_ranks(topo.node)
        NB = sum(sizes[r] for r in node)
        p_ids, p_valid, _ = _first_ids(ex.lengths, torch.cumsum(ex.lengths, 0) - ex.lengths, ex.values)
        p_feature = torch.arange(F, device=device).repeat_interleave(NB)
        p_shard = torch.div(p_ids, blocks[p_feature], rounding_mode="floor")
        p_valid = p_valid & (p_shard % L == topo.local_rank)
        p_group = torch.div(p_shard, L, rounding_mode="floor") * F + p_feature
        p_uid, _, p_counts = sorted_unique_one_hot(p_group, p_ids - p_shard * blocks[p_feature], p_valid,
                                                   N * F, self.radix)
        # which of them each rank of the node uses, and how many per group
        cap = F * NB
        rank_ends = host_to_device([sum(sizes[r] for r in node[:k + 1]) for k in range(L)], device)
        p_rank = torch.bucketize(torch.arange(NB, device=device), rank_ends, right=True).repeat(F)
        uid_or_cap = torch.where(p_valid, p_uid, cap)
        used = torch.zeros(L, cap + 1, dtype=torch.bool, device=device)
        used[p_rank, uid_or_cap] = True
        used = used[:, :cap]
        group_of_uid = torch.zeros(cap + 1, dtype=torch.int64, device=device).scatter_(
            0, uid_or_cap, torch.where(p_valid, p_group, 0))[:cap]
        sub_counts = torch.zeros(L, N * F, dtype=torch.int64, device=device).scatter_add_(
            1, group_of_uid.expand(L, cap), used.long())
        position = torch.cumsum(used.long(), 1) - 1
        chosen = torch.zeros(L, cap + 1, dtype=torch.int64, device=device).scatter_(
            1, torch.where(used, position, cap), torch.arange(cap, device=device).expand(L, cap).contiguous())
        return chosen, p_counts, sub_counts

    def _build(self, step: DedupStep, o_first: torch.Tensor, counts: dict, chosen: torch.Tensor,
               s_uid: torch.Tensor, s_group: torch.Tensor) -> TwoLevelPlan:
        d = [e.dim // self.unit for e in self.entries]
        # owner -> rail: to node n, per feature, its distinct rows (o_first in (node, feature, id) order)
        rail_send, rail_send_splits = owner_send_index(o_first, counts["owner"], self.topology.nodes, d,
                                                       step.global_batch, self.unit)
        rail_recv_splits, intra_send, intra_send_splits = self._forward(step, counts, chosen, d)
        intra_recv_splits, recv_index = self._receive(step, counts, s_uid, s_group, d)
        return TwoLevelPlan(self.unit, rail_send, rail_send_splits, rail_recv_splits, intra_send,
                            intra_send_splits, intra_recv_splits, recv_index, (step.batch, sum(d) * self.unit),
                            self.groups, pad_units=max(d, default=0))

    def _forward(self, step: DedupStep, counts: dict, chosen: torch.Tensor, d: list[int]
                 ) -> tuple[list[int], torch.Tensor, list[int]]:
        """Rail -> forwarder: groups (node m, feature i) in order; forwarder -> intra: to local rank k,
        the rows its bags use, group by group (ascending uid)."""
        F, L, N, unit = len(self.entries), self.topology.ranks_per_node, self.topology.nodes, self.unit
        rail_start, first_uid, at, uid = [], [], 0, 0
        rail_recv_splits = [0] * N
        for m in range(N):
            for i in range(F):
                c = counts["fwd"][m * F + i]
                rail_start.append(at)
                first_uid.append(uid)
                at += c * d[i]
                uid += c
                rail_recv_splits[m] += c * d[i] * unit
        intra_send, intra_send_splits = [], []
        for k in range(L):
            elems, a = 0, 0
            for g in range(N * F):
                c, i = counts["sub"][k][g], g % F
                intra_send.append(unit_rows(rail_start[g] + (chosen[k, a:a + c] - first_uid[g]) * d[i], d[i]))
                a += c
                elems += c * d[i] * unit
            intra_send_splits.append(elems)
        return rail_recv_splits, cat_or_empty(intra_send, step.device), intra_send_splits

    def _receive(self, step: DedupStep, counts: dict, s_uid: torch.Tensor, s_group: torch.Tensor, d: list[int]
                 ) -> tuple[list[int], torch.Tensor]:
        """Receiver: from local rank k, shards (m, k) of every node m, per feature; then pick per bag
        (empty bags read the zero row after the message)."""
        topo, W, F, unit, B, device = self.topology, self.world_size, len(self.entries), self.unit, step.batch, \
            step.device
        base = [0] * (W * F)
        at = 0
        intra_recv_splits = []
        for k in range(topo.ranks_per_node):
            elems = 0
            for m in range(topo.nodes):
                shard = m * topo.ranks_per_node + k
                for i in range(F):
                    c = counts["own"][shard * F + i]
                    base[shard * F + i] = at
                    at += c * d[i]
                    elems += c * d[i] * unit
            intra_recv_splits.append(elems)
        zero_unit = at  # one all-zero row after the message: empty bags point there
        first_own, uid = [], 0
        for g in range(W * F):
            first_own.append(uid)
            uid += counts["own"][g]
        base_t = host_to_device(base + [zero_unit], device)
        first_t = host_to_device(first_own + [uid], device)
        recv_parts = []
        for i in range(F):
            u = s_uid[i * B:(i + 1) * B]
            valid = u < uid
            group = torch.where(valid, s_group[i * B:(i + 1) * B], W * F)
            start = torch.where(valid, base_t[group] + (u - first_t[group]) * d[i], zero_unit)
            recv_parts.append(start.unsqueeze(1) + torch.arange(d[i], device=device))
        recv_index = torch.cat(recv_parts, dim=1).reshape(-1) if recv_parts else cat_or_empty([], device)
        return intra_recv_splits, recv_index

    def _account(self, step: DedupStep, ex: NodeExchange, counts: dict) -> None:
        """This step's bytes per table (host integers only), as one-level row-wise counts them."""
        W, F, N = self.world_size, len(self.entries), self.topology.nodes
        stats, wire, elem, sizes, B = step.stats, step.wire_bytes, step.elem_bytes, step.sizes, step.batch
        owner_kjt, sample_kjt = step.owner_kjt, step.sample_kjt
        owner_values, sample_values = owner_kjt.length_per_key(), sample_kjt.length_per_key()
        for i, e in enumerate(self.entries):
            t = stats.table(e.table)
            t.add_rows(e.dim, wire, elem, sent=sum(counts["owner"][n * F + i] for n in range(N)),
                       received=sum(counts["own"][s * F + i] for s in range(W)), stock_sent=sum(sizes))
            t.id_sent_bytes += (sample_values[i] * sample_kjt.values().element_size()
                                + W * B * sample_kjt.lengths().element_size())
            t.id_recv_bytes += (owner_values[i] * owner_kjt.values().element_size()
                                + sum(sizes) * owner_kjt.lengths().element_size())
            t.add_rows(e.dim, wire, elem, stock_received=W * B, bags=B)
        stats.id_exchange_bytes += ex.exchanged_bytes
        stats.messages += ex.messages
