"""dedup in two levels (`comm.hierarchy: node`): node-level unique rows cross between nodes once.

Ranks sit on N nodes of L (comm/topology.py). Owner o (node m, local rank l)
holds, from TorchRec's id all-to-all, the ids of every sample rank's bags for
its features. For each destination node n it deduplicates over the bags of
ALL of node n's ranks at once (the node block: their blocks are contiguous in
o's KJT) and sends those rows over its rail to its peer p = (n, l) (o itself
when n == m). p forwards, over the intra-node group, to each rank r of its node
the rows of r's own distinct bags; r expands them as one-level dedup does.

Nobody sends an index. p needs the ids of its node's bags for the features of
its rail's owners: the ranks of a node exchange them (`_exchange_ids`: one
small all-gather of per-feature id counts and longest bags, one all-to-all of
lengths and ids, both inside the node; ids are 8 bytes where a row is 4·D).
With them p computes the same node-level unique as o (same keys, same sort),
and for each r the node-unique rows r's bags use, in node-unique order: the
unique order is the lexicographic order of the bag keys, so that subset, in
order, IS r's own unique set as r computes it from its own ids.

Backward mirrors it: r segment-sums its gradient per unique bag and sends it
to p; p sums the rows of its node's ranks per node-unique bag and sends one
gradient per distinct bag back over the rail; o writes it at the bag's first
occurrence in the node block (zeros elsewhere) for the fused embedding
backward, divided by the world size like TorchRec's all-to-all backward.

Host syncs: two per dist per step (the id counts of the exchange; all blocks'
unique counts; tests/comm/test_two_level.py counts them). Key widths come
from the longest bag per block, read in the first, so multi-hot bags never
need a retry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dlrmtrain.comm.dedup.kernels import BlockUnique, block_unique, host_to_device, one_hot_blocks_unique
from dlrmtrain.comm.dedup.plan import DedupStep
from dlrmtrain.comm.layout import DistLayout, FeatureEntry
from dlrmtrain.comm.topology import NodeGroups, NodeTopology


@dataclass
class TwoLevelPlan:
    """One step's indices and splits, in units of `unit` columns (elements in the splits)."""

    unit: int
    rail_send_index: torch.Tensor
    """unit rows of the owner's local embeddings, in rail message order (node-unique rows)"""
    rail_send_splits: list[int]
    """elements per node (rail group rank)"""
    rail_recv_splits: list[int]
    intra_send_index: torch.Tensor
    """unit rows of the rail receive buffer, in intra-node message order"""
    intra_send_splits: list[int]
    """elements per local rank (intra-node group rank)"""
    intra_recv_splits: list[int]
    recv_index: torch.Tensor
    """per output unit row: its unit row in the intra-node receive buffer"""
    out_shape: tuple[int, int]
    groups: NodeGroups
    pad_units: int = 0
    """zero unit rows after the intra-node receive buffer (row-wise: what empty bags read)"""

    def traffic(self, topology: NodeTopology) -> list[tuple[int, int, int]]:
        """(peer rank, elements sent, elements received) of each forward message pair; backward mirrors."""
        rail = topology.rail_ranks(topology.local_rank)
        node = topology.node_ranks(topology.node)
        return (list(zip(rail, self.rail_send_splits, self.rail_recv_splits))
                + list(zip(node, self.intra_send_splits, self.intra_recv_splits)))


@dataclass
class BagBlock:
    """One block of bags to deduplicate: bags [start, start + size) of a (values, offsets, lengths) triple."""

    start: int
    size: int
    width: int
    entry: FeatureEntry
    dedup: bool


@dataclass
class _NodeIds:
    """This rank's node's bags for the features of its rail's owners (what p deduplicates)."""

    values: torch.Tensor
    offsets: torch.Tensor
    lengths: torch.Tensor
    widths: list[int]
    """per rail feature (in `rail_features` order): the longest bag over the node"""
    own_widths: list[int]
    """per feature of the all-to-all: this rank's longest bag"""
    owner_widths: list[list[int]]
    """[local entry][node]: the longest bag of each node block this rank owns"""
    exchanged_bytes: int
    messages: int


def _identity(size: int, device: torch.device) -> BlockUnique:
    """Every bag its own row: a table sent in full (codec `none` inside the all-to-all)."""
    ar = torch.arange(size, device=device)
    false = torch.zeros((), dtype=torch.bool, device=device)
    return BlockUnique(ar, ar, torch.full((), size, dtype=torch.int64, device=device), false, false)


def blocks_unique(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                  specs: list[BagBlock]) -> list[BlockUnique]:
    """Unique bags of each block; one-hot blocks share one sort (`one_hot_blocks_unique`)."""
    device = lengths.device
    out: list[BlockUnique | None] = [None] * len(specs)
    batched = []
    for k, s in enumerate(specs):
        if not s.dedup:
            out[k] = _identity(s.size, device)
        elif s.width <= 1:
            batched.append(k)
        else:
            out[k] = block_unique(values, offsets[s.start:s.start + s.size], lengths[s.start:s.start + s.size],
                                  s.width, s.entry.num_embeddings)
    if batched:
        uniques = one_hot_blocks_unique(values, offsets, lengths, [specs[k].start for k in batched],
                                        [specs[k].size for k in batched],
                                        [specs[k].entry.num_embeddings for k in batched])
        for k, u in zip(batched, uniques):
            out[k] = u
    return out


def used_subset(u: BlockUnique, start: int, size: int, node_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The node-unique rows bags [start, start + size) use, ascending, and their count.

    Fixed-size result (valid below the count): no host sync.
    """
    device = u.inverse.device
    used = torch.zeros(node_size + 1, dtype=torch.bool, device=device)
    used[u.inverse[start:start + size]] = True
    used = used[:node_size]
    position = torch.cumsum(used, 0) - 1
    subset = torch.zeros(node_size + 1, dtype=torch.int64, device=device)
    subset.scatter_(0, torch.where(used, position, node_size), torch.arange(node_size, device=device))
    return subset[:node_size], used.sum()


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


@dataclass
class NodeExchange:
    """What `exchange_node_ids` returns: the node's bags of this rank's rail features, feature-major."""

    values: torch.Tensor
    lengths: torch.Tensor
    """per rail feature (in order), the bags of local rank 0, 1, ... of the node (its node block)"""
    longest_of: list[list[int]]
    """[local rank][feature of the all-to-all]: that rank's longest bag"""
    extra: list[int]
    """the caller's `extra` values, read in the same host sync"""
    exchanged_bytes: int
    messages: int


def exchange_node_ids(step: DedupStep, topo: NodeTopology, groups: NodeGroups, rail_features: list[list[int]],
                      extra: torch.Tensor | None = None) -> NodeExchange:
    """Send each rank of the node the bags (lengths, ids) of the features in `rail_features[its local rank]`.

    One all-gather of per-feature id counts and longest bags (plus the host
    sync that reads them, and `extra`), then one all-to-all of lengths and ids,
    both over the intra-node group.
    """
    kjt, B = step.sample_kjt, step.batch
    L, F = topo.ranks_per_node, len(kjt.keys())
    node = topo.node_ranks(topo.node)
    device = kjt.lengths().device
    lengths = kjt.lengths().to(torch.int64)
    values = kjt.values().to(torch.int64)
    per_key = kjt.length_per_key() if F else []
    longest = lengths.view(F, B).amax(1) if F and B else torch.zeros(F, dtype=torch.int64, device=device)
    mine = torch.cat([host_to_device(per_key, device), longest])
    gathered = [torch.empty_like(mine) for _ in range(L)]
    dist.all_gather(gathered, mine, group=groups.intra)
    flat = torch.cat([torch.stack(gathered).view(-1)] + ([extra.view(-1)] if extra is not None else [])).tolist()
    counts_of = [flat[k * 2 * F:k * 2 * F + F] for k in range(L)]  # ids per feature, per local rank
    longest_of = [flat[k * 2 * F + F:(k + 1) * 2 * F] for k in range(L)]

    # one all-to-all: to local rank l, the lengths then the ids of rail l's features
    key_offsets = [0]
    for c in per_key:
        key_offsets.append(key_offsets[-1] + c)
    send_parts, send_splits = [], []
    for l in range(L):
        feats = rail_features[l]
        send_parts += [lengths[j * B:(j + 1) * B] for j in feats]
        send_parts += [values[key_offsets[j]:key_offsets[j + 1]] for j in feats]
        send_splits.append(len(feats) * B + sum(per_key[j] for j in feats))
    mine_feats = rail_features[topo.local_rank]
    recv_splits = [len(mine_feats) * step.sizes[r] + sum(counts_of[k][j] for j in mine_feats)
                   for k, r in enumerate(node)]
    send = torch.cat(send_parts) if send_parts else values.new_zeros(0)
    recv = values.new_empty(sum(recv_splits))
    dist.all_to_all_single(recv, send, recv_splits, send_splits, group=groups.intra)

    # regroup feature-major: for each rail feature, the bags of local rank 0, 1, ... (the node block)
    len_pieces: list[list[torch.Tensor]] = [[] for _ in mine_feats]
    val_pieces: list[list[torch.Tensor]] = [[] for _ in mine_feats]
    at = 0
    for k, r in enumerate(node):
        for f in range(len(mine_feats)):
            len_pieces[f].append(recv[at:at + step.sizes[r]])
            at += step.sizes[r]
        for f, j in enumerate(mine_feats):
            val_pieces[f].append(recv[at:at + counts_of[k][j]])
            at += counts_of[k][j]
    node_lengths = torch.cat([p for ps in len_pieces for p in ps]) if mine_feats else lengths.new_zeros(0)
    node_values = torch.cat([p for ps in val_pieces for p in ps]) if mine_feats else values.new_zeros(0)
    own = topo.local_rank
    exchanged = sum(s for k, s in enumerate(send_splits) if k != own) * 8 + (L - 1) * mine.numel() * 8
    messages = sum(1 for k, s in enumerate(send_splits) if k != own and s) + (L - 1)
    extra_host = flat[L * 2 * F:]
    return NodeExchange(node_values, node_lengths, longest_of, extra_host, exchanged, messages)


class TwoLevelPlanner:
    """Plans the two-level exchange of one table-/column-wise all-to-all (see the module docstring)."""

    def __init__(self, layout: DistLayout, dedup_tables: set[str], topology: NodeTopology,
                 groups: NodeGroups) -> None:
        self.layout = layout
        self.topology = topology
        self.groups = groups
        self.rank = topology.rank
        self.world_size = layout.world_size
        self.dedup_tables = dedup_tables
        self.all_entries = layout.all_entries()
        self.local_entries = layout.entries_per_rank[self.rank]
        dims = [e.dim for e in self.all_entries]
        self.unit = math.gcd(*dims) if dims else 1
        # global feature index j (all_entries order) of each owner's entries
        self.features_of: list[list[int]] = []
        j = 0
        for entries in layout.entries_per_rank:
            self.features_of.append(list(range(j, j + len(entries))))
            j += len(entries)
        L = topology.ranks_per_node
        # features whose owner sits on rail l, in (node, entry) order: what p of rail l forwards
        self.rail_features = [[j for o in topology.rail_ranks(l) for j in self.features_of[o]] for l in range(L)]

    # ------------------------------------------------------------------ ids
    def _exchange_ids(self, step: DedupStep) -> _NodeIds:
        """The ids this rank's node holds for its rail's features, gathered inside the node."""
        topo, L = self.topology, self.topology.ranks_per_node
        # the owner's longest bag per node block, read in the exchange's host sync
        owner_lengths = step.owner_kjt.lengths()
        GB, starts, sizes = step.global_batch, step.starts, step.sizes
        node_start = [starts[n * L] for n in range(topo.nodes)]
        node_size = [sum(sizes[n * L:(n + 1) * L]) for n in range(topo.nodes)]
        owner_max = [owner_lengths[i * GB + node_start[n]:i * GB + node_start[n] + node_size[n]].amax()
                     if node_size[n] else owner_lengths.new_zeros(()) for i in range(len(self.local_entries))
                     for n in range(topo.nodes)]
        ex = exchange_node_ids(step, topo, self.groups, self.rail_features,
                               torch.stack(owner_max).to(torch.int64) if owner_max else None)
        owner_widths = [[max(1, ex.extra[i * topo.nodes + n]) for n in range(topo.nodes)]
                        for i in range(len(self.local_entries))]
        mine = self.rail_features[topo.local_rank]
        widths = [max(1, max(ex.longest_of[k][j] for k in range(L))) for j in mine]
        own = [max(1, w) for w in ex.longest_of[topo.local_rank]]
        return _NodeIds(ex.values, _offsets(ex.lengths), ex.lengths, widths, own, owner_widths,
                        ex.exchanged_bytes, ex.messages)

    # ----------------------------------------------------------------- plan
    def plan(self, step: DedupStep) -> TwoLevelPlan:
        topo = self.topology
        L, N = topo.ranks_per_node, topo.nodes
        sizes, starts, B, GB = step.sizes, step.starts, step.batch, step.global_batch
        node = topo.node_ranks(topo.node)
        NB = sum(sizes[r] for r in node)  # this node's batch
        ids = self._exchange_ids(step)

        # owner: one block per (local entry, destination node)
        node_start = [starts[n * L] for n in range(N)]
        node_size = [sum(sizes[n * L:(n + 1) * L]) for n in range(N)]
        owner_specs = [BagBlock(i * GB + node_start[n], node_size[n], ids.owner_widths[i][n], e,
                             e.table in self.dedup_tables)
                       for i, e in enumerate(self.local_entries) for n in range(N)]
        okjt = step.owner_kjt
        owner = blocks_unique(okjt.values(), okjt.offsets(), okjt.lengths(), owner_specs)
        # forwarder: one node block per rail feature, and the subset each rank of the node uses
        feats = self.rail_features[topo.local_rank]
        fwd_specs = [BagBlock(k * NB, NB, ids.widths[k], self.all_entries[j], self.all_entries[j].table in
                           self.dedup_tables) for k, j in enumerate(feats)]
        fwd = blocks_unique(ids.values, ids.offsets, ids.lengths, fwd_specs)
        rank_start = [sum(sizes[r] for r in node[:k]) for k in range(L)]
        subsets = [[used_subset(u, rank_start[k], sizes[r], NB) for u in fwd] for k, r in enumerate(node)]
        # sample rank: its own bags, as one-level dedup
        skjt = step.sample_kjt
        own_specs = [BagBlock(j * B, B, ids.own_widths[j], e, e.table in self.dedup_tables)
                     for j, e in enumerate(self.all_entries)]
        own = blocks_unique(skjt.values(), skjt.offsets(), skjt.lengths(), own_specs)

        # the step's second and last host sync: every count and bad-id flag at once
        blocks = owner + fwd + own
        counted = [u.count for u in blocks] + [c for row in subsets for _, c in row]
        flags = [u.bad_ids for u in blocks]
        flat = torch.stack([c.to(torch.int64) for c in counted] + [f.to(torch.int64) for f in flags]).tolist() \
            if counted else []
        nb = len(blocks)
        for k, bad in enumerate(flat[len(counted):]):
            if bad:
                e = (owner_specs + fwd_specs + own_specs)[k].entry
                raise ValueError(f"feature {e.feature!r} (table {e.table!r}): ids outside "
                                 f"[0, {e.num_embeddings}) reached the dedup codec")
        owner_counts = flat[:len(owner)]
        fwd_counts = flat[len(owner):len(owner) + len(fwd)]
        own_counts = flat[len(owner) + len(fwd):nb]
        subset_counts = [flat[nb + k * len(fwd):nb + (k + 1) * len(fwd)] for k in range(L)]

        plan = self._build(step, owner, owner_counts, node_start, fwd_counts, subsets, subset_counts,
                           own, own_counts)
        self._account(step, ids, owner_counts, node_size, own_counts)
        return plan

    def _build(self, step: DedupStep, owner: list[BlockUnique], owner_counts: list[int], node_start: list[int],
               fwd_counts: list[int], subsets, subset_counts: list[list[int]], own: list[BlockUnique],
               own_counts: list[int]) -> TwoLevelPlan:
        topo, unit = self.topology, self.unit
        L, N = topo.ranks_per_node, topo.nodes
        device = step.device
        B = step.batch
        empty = torch.zeros(0, dtype=torch.int64, device=device)

        def units(base: torch.Tensor, d: int) -> torch.Tensor:  # unit rows of d units from each base
            return (base.unsqueeze(1) + torch.arange(d, device=device)).reshape(-1)

        # owner -> rail: to node n, the node-unique rows of each local entry
        local_units = sum(e.dim for e in self.local_entries) // unit
        col = [0]
        for e in self.local_entries:
            col.append(col[-1] + e.dim // unit)
        rail_send, rail_send_splits = [], []
        for n in range(N):
            elems = 0
            for i, e in enumerate(self.local_entries):
                c = owner_counts[i * N + n]
                rows = node_start[n] + owner[i * N + n].first[:c]
                rail_send.append(units(rows * local_units + col[i], e.dim // unit))
                elems += c * e.dim
            rail_send_splits.append(elems)
        # rail -> forwarder: from node m, the node-unique rows of its owner's entries (feats order)
        feats = self.rail_features[topo.local_rank]
        rail_at, at = [], 0
        rail_recv_splits = [0] * N
        for k, j in enumerate(feats):
            e = self.all_entries[j]
            rail_at.append(at)
            at += fwd_counts[k] * e.dim // unit
            rail_recv_splits[topo.node_of(self._owner_of(j))] += fwd_counts[k] * e.dim
        # forwarder -> intra: to local rank k, the rows its bags use, per rail feature
        intra_send, intra_send_splits = [], []
        for k in range(L):
            elems = 0
            for f, j in enumerate(feats):
                d = self.all_entries[j].dim // unit
                c = subset_counts[k][f]
                intra_send.append(units(rail_at[f] + subsets[k][f][0][:c] * d, d))
                elems += c * self.all_entries[j].dim
            intra_send_splits.append(elems)
        # receiver: from local rank k, the rows of rail k's features; then expand in output order
        intra_at: dict[int, int] = {}
        at = 0
        intra_recv_splits = []
        for k in range(L):
            elems = 0
            for j in self.rail_features[k]:
                e = self.all_entries[j]
                intra_at[j] = at
                at += own_counts[j] * e.dim // unit
                elems += own_counts[j] * e.dim
            intra_recv_splits.append(elems)
        recv_parts = [intra_at[j] + own[j].inverse.unsqueeze(1) * (e.dim // unit)
                      + torch.arange(e.dim // unit, device=device) for j, e in enumerate(self.all_entries)]
        recv_index = torch.cat(recv_parts, dim=1).reshape(-1) if recv_parts else empty
        out_dim = sum(e.dim for e in self.all_entries)
        cat = lambda parts: torch.cat(parts) if parts else empty  # noqa: E731
        return TwoLevelPlan(unit, cat(rail_send), rail_send_splits, rail_recv_splits, cat(intra_send),
                            intra_send_splits, intra_recv_splits, recv_index, (B, out_dim), self.groups)

    def _owner_of(self, j: int) -> int:
        for o, feats in enumerate(self.features_of):
            if feats and feats[0] <= j <= feats[-1]:
                return o
        raise IndexError(j)

    # ------------------------------------------------------------- counters
    def _account(self, step: DedupStep, ids: _NodeIds, owner_counts: list[int], node_size: list[int],
                 own_counts: list[int]) -> None:
        """This step's bytes per table, as one-level dedup counts them: rows the owner puts on its
        rail (the node-unique rows), rows reaching this rank; the ids of both all-to-alls.
        Bytes and messages between nodes are counted per message by the dist (`TwoLevelPlan.traffic`)."""
        stats, wire, elem = step.stats, step.wire_bytes, step.elem_bytes
        N = self.topology.nodes
        okjt, skjt, sizes, B = step.owner_kjt, step.sample_kjt, step.sizes, step.batch
        owner_lengths = okjt.length_per_key() if self.local_entries else []
        for i, e in enumerate(self.local_entries):
            t = stats.table(e.table)
            for n in range(N):
                t.add_rows(e.dim, wire, elem, sent=owner_counts[i * N + n], stock_sent=node_size[n])
            t.id_recv_bytes += (owner_lengths[i] * okjt.values().element_size()
                                + sum(sizes) * okjt.lengths().element_size())
        sample_lengths = skjt.length_per_key() if self.all_entries else []
        for j, e in enumerate(self.all_entries):
            t = stats.table(e.table)
            t.add_rows(e.dim, wire, elem, received=own_counts[j], stock_received=B, bags=B)
            t.id_sent_bytes += (sample_lengths[j] * skjt.values().element_size()
                                + B * skjt.lengths().element_size())
        stats.id_exchange_bytes += ids.exchanged_bytes
        stats.messages += ids.messages
