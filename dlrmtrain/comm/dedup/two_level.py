"""dedup in two levels (`comm.hierarchy: node`): node-level unique rows cross between nodes once.

Ranks sit on N nodes of L (comm/topology.py). Owner o (node m, local rank l)
holds, from TorchRec's id all-to-all, the ids of every sample rank's bags for
its features. Two stages:

1. At launch, two transfers at once. Over its rail (between nodes, the slow
   hop) o sends each other node n, to its peer p = (n, l), the rows of the
   distinct bags over ALL of node n's ranks (the node block: their blocks are
   contiguous in o's KJT). Inside its node (the fast hop) o sends each rank r
   of its own node the rows of r's own distinct bags, as one-level dedup does:
   they need no forwarder, so they never wait for the rail.
2. When the rail hop is done, p forwards to each rank r of its node the rows
   of r's own distinct bags among what it received; r expands both stages'
   rows as one-level dedup does.

Nobody sends an index. Before the launch each owner tells its rail peers how
many node-unique rows of each of its entries their node gets (a small
all-to-all on the rail: their receive splits, read in the step's first host
sync with every unique count), so the rail hop waits for no other rank of the
node. Then, while the rows travel (`TwoLevelPlan.complete`), p gets the ids of
its node's bags for the features that other nodes' ranks of its rail own: the
ranks of a node exchange them (`exchange_node_ids`: one small all-gather of
per-feature id counts, longest bags and unique counts, launched with stage 1;
when it is in, a callback reads it (the second host sync) and launches one
all-to-all of lengths and ids, so no rank waits for its node's others before
`complete`; both inside the node; ids are 8 bytes where a row is 4·D). With them p computes the same node-level unique as o
(same keys, same sort) and, for each r, the node-unique rows r's bags use, in
node-unique order: the unique order is the lexicographic order of the bag
keys, so that subset, in order, IS r's own unique set as r computes it.

Backward mirrors it: r segment-sums its gradient per unique bag and sends the
sums of stage 2's rows to their forwarders, p sums them over its node's ranks
per node-unique bag and sends one gradient per distinct bag back over the
rail; stage 1's sums go straight back to their owner. o writes each sum at
its bag's first occurrence (zeros elsewhere) for the fused embedding backward,
divided by the world size like TorchRec's all-to-all backward.

Host syncs: two per dist per step (every unique count with the rail peers'
counts; the id exchange's counts; tests/comm/test_two_level.py counts them).
Key widths are learned as one-level dedup learns them: a step where a bag
outgrows its width widens it with one more sync and redoes the count exchange
on the rail.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torchrec.streamable import Multistreamable

from dlrmtrain.comm import streams
from dlrmtrain.comm.dedup.kernels import BlockUnique, host_to_device
from dlrmtrain.comm.dedup.kernels import blocks_unique as keyed_blocks_unique
from dlrmtrain.comm.dedup.plan import DedupStep
from dlrmtrain.comm.layout import DistLayout, FeatureEntry
from dlrmtrain.comm.topology import NodeGroups, NodeTopology


@dataclass
class TwoLevelPlan(Multistreamable):
    """One step's indices and splits, in units of `unit` columns (elements in the splits).

    The owner's rows travel in stage 1: `local_*` to the ranks of its own node
    (None: no such stage, row-wise) and `rail_*` to the other nodes; stage 2
    (`intra_*`) forwards rows of the rail receive buffer inside the node. The
    receive buffer that `recv_index` reads is [stage 1 local | stage 2 | pad].
    """

    unit: int
    send_index: torch.Tensor
    """unit rows of the owner's local embeddings: stage 1's local message, then the rail message"""
    rail_send_splits: list[int]
    """elements per node (rail group rank)"""
    rail_recv_splits: list[int]
    intra_send_index: torch.Tensor | None
    """unit rows of the rail receive buffer, in stage 2's message order (None until `complete`)"""
    intra_send_splits: list[int] | None
    """elements per local rank (intra-node group rank); None until `complete`"""
    intra_recv_splits: list[int]
    recv_index: torch.Tensor | None
    """per output unit row: its unit row in the receive buffer (None until `complete`)"""
    out_shape: tuple[int, int]
    groups: NodeGroups
    pad_units: int = 0
    """zero unit rows after the receive buffer (row-wise: what empty bags read)"""
    local_send_splits: list[int] | None = None
    """stage 1 inside the node: elements to each local rank (None: no such stage)"""
    local_recv_splits: list[int] | None = None
    deferred: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    """builds (intra_send_index, recv_index) and sets `intra_send_splits`; called once stage 1 is launched"""

    def complete(self) -> None:
        """Build what only stage 2 and the expand need (no host sync)."""
        if self.deferred is not None:
            self.intra_send_index, self.recv_index = self.deferred()
            self.deferred = None

    def record_stream(self, stream) -> None:
        """Every tensor of the plan is used on `stream`, the deferred stage 2's (in its closure) too."""
        streams.record_stream(self, stream)

    @property
    def local_elems(self) -> int:
        """elements of the owner's send buffer in stage 1's local message"""
        return sum(self.local_send_splits) if self.local_send_splits is not None else 0

    @property
    def local_recv_elems(self) -> int:
        return sum(self.local_recv_splits) if self.local_recv_splits is not None else 0

    def traffic(self, topology: NodeTopology) -> list[tuple[int, int, int]]:
        """(peer rank, elements sent, elements received) of each forward message pair; backward mirrors."""
        rail = topology.rail_ranks(topology.local_rank)
        node = topology.node_ranks(topology.node)
        local = (list(zip(node, self.local_send_splits, self.local_recv_splits))
                 if self.local_send_splits is not None else [])
        stage2 = ([] if self.intra_send_splits is None  # known, and counted, only in `complete`
                  else list(zip(node, self.intra_send_splits, self.intra_recv_splits)))
        return list(zip(rail, self.rail_send_splits, self.rail_recv_splits)) + local + stage2


@dataclass
class BagBlock:
    """One block of bags to deduplicate: bags [start, start + size) of a (values, offsets, lengths) triple."""

    start: int
    size: int
    width: int
    entry: FeatureEntry
    dedup: bool


def _identity(size: int, device: torch.device) -> BlockUnique:
    """Every bag its own row: a table sent in full (codec `none` inside the all-to-all)."""
    ar = torch.arange(size, device=device)
    false = torch.zeros((), dtype=torch.bool, device=device)
    return BlockUnique(ar, ar, torch.full((), size, dtype=torch.int64, device=device), false, false)


def blocks_unique(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                  specs: list[BagBlock]) -> list[BlockUnique]:
    """Unique bags of each block; blocks of one size and key width share one `kernels.blocks_unique`
    call (one-hot: one sort; multi-hot: log2(width) + 1 sorts, not one per column and block)."""
    device = lengths.device
    out: list[BlockUnique | None] = [None] * len(specs)
    by_shape: dict[tuple[int, int], list[int]] = {}
    for k, s in enumerate(specs):
        if not s.dedup:
            out[k] = _identity(s.size, device)
        else:
            by_shape.setdefault((s.size, max(1, s.width)), []).append(k)
    for (size, width), batched in by_shape.items():
        # blocks of one size laid end to end take the one-hot fast path (a [blocks, size]
        # view); blocks elsewhere (an owner's node blocks, one per table) are gathered so first
        runs = [specs[k].start for k in batched]
        if all(b == a + size for a, b in zip(runs, runs[1:])):
            offs, lens, starts = offsets, lengths, runs
        else:
            bags = (host_to_device(runs, device).unsqueeze(1) + torch.arange(size, device=device)).view(-1)
            offs, lens, starts = offsets[bags], lengths[bags], [b * size for b in range(len(batched))]
        uniques = keyed_blocks_unique(values, offs, lens, starts, [size] * len(batched), width,
                                      [specs[k].entry.num_embeddings for k in batched]).split()
        for k, u in zip(batched, uniques):
            out[k] = u
    return out


def node_subsets(inverses: list[torch.Tensor], rank_sizes: list[int], node_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """For each rank k of a node and each node block f: the node-unique rows bags of rank k use.

    `inverses[f]` maps each of the node's `node_size` bags (rank 0's first) to
    its node-unique row. Returns `chosen` [L, F, node_size] (row [k, f] holds
    rank k's rows of block f ascending, valid below `counts[k, f]`) and
    `counts` [L, F]. Every rank and block at once, fixed sizes: no host sync.
    """
    F, L, NB = len(inverses), len(rank_sizes), node_size
    device = inverses[0].device
    inverse = torch.stack(inverses)  # [F, NB]
    used = torch.zeros(L, F, NB + 1, dtype=torch.bool, device=device)
    at = 0
    for k, n in enumerate(rank_sizes):
        used[k].scatter_(1, inverse[:, at:at + n], True)
        at += n
    used = used[..., :NB]
    counts = used.sum(2)
    position = torch.cumsum(used, 2) - 1
    chosen = torch.zeros(L, F, NB + 1, dtype=torch.int64, device=device)
    chosen.scatter_(2, torch.where(used, position, NB), torch.arange(NB, device=device).expand(L, F, NB).contiguous())
    return chosen[..., :NB], counts


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
    gathered_of: list[list[int]]
    """[local rank]: that rank's `gathered` values (the caller's, all-gathered with the counts)"""
    exchanged_bytes: int
    messages: int


@dataclass
class CountsInFlight:
    """The first half of `exchange_node_ids`: its all-gather, launched and not yet read."""

    work: Any
    mine: torch.Tensor
    everyone: list[torch.Tensor]


def start_node_counts(step: DedupStep, topo: NodeTopology, groups: NodeGroups,
                      gathered: torch.Tensor | None = None) -> CountsInFlight:
    """Launch the all-gather of per-feature id counts and longest bags (and `gathered`, the same
    number of values on every rank) over the intra-node group; `start_node_ids` reads it."""
    kjt, B = step.sample_kjt, step.batch
    F = len(kjt.keys())
    lengths = kjt.lengths().to(torch.int64)
    per_key = kjt.length_per_key() if F else []
    longest = lengths.view(F, B).amax(1) if F and B else lengths.new_zeros(F)
    more = gathered.view(-1).to(torch.int64) if gathered is not None else longest.new_zeros(0)
    mine = torch.cat([host_to_device(per_key, lengths.device), longest, more])
    everyone = [torch.empty_like(mine) for _ in range(topo.ranks_per_node)]
    return CountsInFlight(dist.all_gather(everyone, mine, group=groups.intra, async_op=True), mine, everyone)


@dataclass
class IdsInFlight:
    """The second half of `exchange_node_ids`: its all-to-all of lengths and ids, launched."""

    work: Any
    recv: torch.Tensor
    send: torch.Tensor  # kept alive until the transfer is done
    counts_of: list[list[int]]
    longest_of: list[list[int]]
    gathered_of: list[list[int]]
    extra: list[int]
    exchanged_bytes: int
    messages: int


def start_node_ids(step: DedupStep, topo: NodeTopology, rail_features: list[list[int]],
                   counts: CountsInFlight, group: dist.ProcessGroup,
                   extra: torch.Tensor | None = None) -> IdsInFlight:
    """Read the all-gathered counts (and `extra`: the host sync) and launch the all-to-all that sends
    each rank of the node, over `group`, the lengths then the ids of the features in
    `rail_features[its local rank]`. The counts must be in: their work waited for, or this called
    from their future's callback (where waiting for the work itself would never return)."""
    kjt, B = step.sample_kjt, step.batch
    L, F = topo.ranks_per_node, len(kjt.keys())
    node = topo.node_ranks(topo.node)
    lengths = kjt.lengths().to(torch.int64)
    values = kjt.values().to(torch.int64)
    per_key = kjt.length_per_key() if F else []
    mine = counts.mine
    flat = torch.cat([torch.stack(counts.everyone).view(-1)]
                     + ([extra.view(-1)] if extra is not None else [])).tolist()
    G = mine.numel()
    counts_of = [flat[k * G:k * G + F] for k in range(L)]  # ids per feature, per local rank
    longest_of = [flat[k * G + F:k * G + 2 * F] for k in range(L)]
    gathered_of = [flat[k * G + 2 * F:(k + 1) * G] for k in range(L)]

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
    work = dist.all_to_all_single(recv, send, recv_splits, send_splits, group=group, async_op=True)
    own = topo.local_rank
    exchanged = sum(s for k, s in enumerate(send_splits) if k != own) * 8 + (L - 1) * mine.numel() * 8
    messages = sum(1 for k, s in enumerate(send_splits) if k != own and s) + (L - 1)
    return IdsInFlight(work, recv, send, counts_of, longest_of, gathered_of, flat[L * G:], exchanged, messages)


def finish_node_ids(step: DedupStep, topo: NodeTopology, rail_features: list[list[int]],
                    ids: IdsInFlight) -> NodeExchange:
    """Wait for `start_node_ids`'s all-to-all and regroup what it brought feature-major: for each
    rail feature, the bags of local rank 0, 1, ... (the node block)."""
    ids.work.wait()
    recv, mine_feats = ids.recv, rail_features[topo.local_rank]
    len_pieces: list[list[torch.Tensor]] = [[] for _ in mine_feats]
    val_pieces: list[list[torch.Tensor]] = [[] for _ in mine_feats]
    at = 0
    for k, r in enumerate(topo.node_ranks(topo.node)):
        for f in range(len(mine_feats)):
            len_pieces[f].append(recv[at:at + step.sizes[r]])
            at += step.sizes[r]
        for f, j in enumerate(mine_feats):
            val_pieces[f].append(recv[at:at + ids.counts_of[k][j]])
            at += ids.counts_of[k][j]
    node_lengths = torch.cat([p for ps in len_pieces for p in ps]) if mine_feats else recv.new_zeros(0)
    node_values = torch.cat([p for ps in val_pieces for p in ps]) if mine_feats else recv.new_zeros(0)
    return NodeExchange(node_values, node_lengths, ids.longest_of, ids.extra, ids.gathered_of,
                        ids.exchanged_bytes, ids.messages)


def exchange_node_ids(step: DedupStep, topo: NodeTopology, groups: NodeGroups, rail_features: list[list[int]],
                      extra: torch.Tensor | None = None) -> NodeExchange:
    """Send each rank of the node the bags (lengths, ids) of the features in `rail_features[its local rank]`.

    One all-gather of per-feature id counts and longest bags, the host sync that reads them
    (and `extra`), then one all-to-all of lengths and ids, both over the
    intra-node group; `start_node_counts`, `start_node_ids` and
    `finish_node_ids` are its three steps, for a caller that overlaps them.
    """
    counts = start_node_counts(step, topo, groups)
    counts.work.wait()
    ids = start_node_ids(step, topo, rail_features, counts, groups.intra, extra)
    return finish_node_ids(step, topo, rail_features, ids)


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
        L, N, n = topology.ranks_per_node, topology.nodes, topology.node
        # features of rail l owned on other nodes, in (node, entry) order: what p of rail l forwards
        self.remote_features = [[j for o in topology.rail_ranks(l) if topology.node_of(o) != n
                                 for j in self.features_of[o]] for l in range(L)]
        self.rail_peers = topology.rail_ranks(topology.local_rank)
        # learned key widths (longest bag so far) of the owner's blocks and of this rank's bags; a bag
        # longer than its width is caught in the host sync and its blocks redone (`_widen`)
        self._owner_widths = [[1] * (L + N - 1) for _ in self.local_entries]
        self._own_widths = [1] * len(self.all_entries)

    # ----------------------------------------------------------------- plan
    def _owner_blocks(self, step: DedupStep) -> list[tuple[int, int]]:
        """(first bag, bags) of each block the owner deduplicates, per local entry: each rank of its
        own node, then each other node's node block (the order of its messages)."""
        topo, L = self.topology, self.topology.ranks_per_node
        starts, sizes = step.starts, step.sizes
        blocks = [(starts[r], sizes[r]) for r in topo.node_ranks(topo.node)]
        blocks += [(starts[m * L], sum(sizes[m * L:(m + 1) * L])) for m in range(topo.nodes) if m != topo.node]
        return blocks

    def _uniques(self, step: DedupStep, blocks: list[tuple[int, int]]):
        okjt, skjt, GB, B = step.owner_kjt, step.sample_kjt, step.global_batch, step.batch
        owner_specs = [BagBlock(i * GB + a, n, self._owner_widths[i][b], e, e.table in self.dedup_tables)
                       for i, e in enumerate(self.local_entries) for b, (a, n) in enumerate(blocks)]
        own_specs = [BagBlock(j * B, B, self._own_widths[j], e, e.table in self.dedup_tables)
                     for j, e in enumerate(self.all_entries)]
        return (owner_specs, blocks_unique(okjt.values(), okjt.offsets(), okjt.lengths(), owner_specs),
                own_specs, blocks_unique(skjt.values(), skjt.offsets(), skjt.lengths(), own_specs))

    def _start_count_exchange(self, owner: list[BlockUnique], flag: torch.Tensor, device: torch.device):
        """Tell each rail peer how many node-unique rows of each of this rank's entries its node gets
        (its receive splits), and whether this rank's counts are exact (`flag`: a bag outgrew its key
        width): one small all-to-all over the rail, N·(entries + 1) integers."""
        topo, L = self.topology, self.topology.ranks_per_node
        nb, E = L + topo.nodes - 1, len(self.local_entries)
        parts, b = [], L
        for m in range(topo.nodes):
            if m == topo.node:
                parts.append(torch.zeros(E, dtype=torch.int64, device=device))
            else:
                parts.append(torch.stack([owner[i * nb + b].count.to(torch.int64) for i in range(E)])
                             if E else torch.zeros(0, dtype=torch.int64, device=device))
                b += 1
            parts.append(flag.view(1))
        send = torch.cat(parts)
        recv_splits = [len(self.features_of[p]) + 1 for p in self.rail_peers]
        recv = send.new_empty(sum(recv_splits))
        work = dist.all_to_all_single(recv, send, recv_splits, [E + 1] * topo.nodes, group=self.groups.rail,
                                      async_op=True)
        return work, recv, send

    def plan(self, step: DedupStep) -> TwoLevelPlan:
        topo = self.topology
        L, N = topo.ranks_per_node, topo.nodes
        t0 = time.perf_counter()
        blocks = self._owner_blocks(step)
        nb = len(blocks)
        owner_specs, owner, own_specs, own = self._uniques(step, blocks)
        for attempt in range(2):
            overflow = torch.stack([u.overflow for u in owner + own]).any().to(torch.int64) \
                if owner + own else torch.zeros((), dtype=torch.int64, device=step.device)
            work, recv, _send = self._start_count_exchange(owner, overflow, step.device)
            # the step's first host sync: every count and flag of both ends, and what the rail peers sent
            uniques = owner + own
            mine = torch.stack([u.count.to(torch.int64) for u in uniques] + [u.bad_ids.to(torch.int64)
                                                                             for u in uniques] + [overflow])
            work.wait()
            flat = torch.cat([mine, recv]).tolist()
            nu = len(uniques)
            for k, bad in enumerate(flat[nu:2 * nu]):
                if bad:
                    e = (owner_specs + own_specs)[k].entry
                    raise ValueError(f"feature {e.feature!r} (table {e.table!r}): ids outside "
                                     f"[0, {e.num_embeddings}) reached the dedup codec")
            peers, at = [], 2 * nu + 1
            for p in self.rail_peers:
                peers.append(flat[at:at + len(self.features_of[p]) + 1])
                at += len(self.features_of[p]) + 1
            if not flat[2 * nu] and not any(c[-1] for c in peers):
                break
            # a bag outgrew its key width here or at a rail peer: every rank of the rail redoes the
            # count exchange (each saw every flag); this rank first widens its own keys
            assert attempt == 0, "key width still too small after widening"
            step.stats.extra_syncs += 1
            if flat[2 * nu]:
                owner_specs, owner, own_specs, own = self._widen(step, blocks)
        owner_counts = flat[:len(owner)]
        own_counts = flat[len(owner):nu]
        fwd_counts = [c for m, cs in enumerate(peers) if m != topo.node for c in cs[:-1]]
        plan = self._build(step, blocks, owner, owner_counts, fwd_counts, own, own_counts)
        self._account(step, blocks, owner_counts, own_counts)
        step.stats.add_hop("plan", time.perf_counter() - t0)  # the dist counts the whole plan as codec time
        return plan

    def _widen(self, step: DedupStep, blocks: list[tuple[int, int]]):
        """Grow every key width to the longest bag of its block (one extra host sync) and redo the uniques."""
        okjt, skjt, GB, B = step.owner_kjt, step.sample_kjt, step.global_batch, step.batch
        ol, sl = okjt.lengths(), skjt.lengths()
        longest = [ol[i * GB + a:i * GB + a + n].amax() if n else ol.new_zeros(())
                   for i in range(len(self.local_entries)) for a, n in blocks]
        longest += [sl[j * B:(j + 1) * B].amax() if B else sl.new_zeros(()) for j in range(len(self.all_entries))]
        host = torch.stack(longest).tolist() if longest else []
        nb = len(blocks)
        for i in range(len(self.local_entries)):
            for b in range(nb):
                self._owner_widths[i][b] = max(self._owner_widths[i][b], host[i * nb + b])
        for j in range(len(self.all_entries)):
            self._own_widths[j] = max(self._own_widths[j], host[len(self.local_entries) * nb + j])
        return self._uniques(step, blocks)

    def _build(self, step: DedupStep, blocks: list[tuple[int, int]], owner: list[BlockUnique],
               owner_counts: list[int], fwd_counts: list[int], own: list[BlockUnique],
               own_counts: list[int]) -> TwoLevelPlan:
        """Stage 1 now; stage 2 once the rail hop is launched (`TwoLevelPlan.complete`: the id
        exchange inside the node, the forwarder's node-level unique, its indices)."""
        topo, unit = self.topology, self.unit
        L, N, n = topo.ranks_per_node, topo.nodes, topo.node
        device = step.device
        node = topo.node_ranks(n)
        NB = sum(step.sizes[r] for r in node)
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        cat = lambda parts: torch.cat(parts) if parts else empty  # noqa: E731
        ar: dict[int, torch.Tensor] = {}

        def units(base: torch.Tensor, d: int) -> torch.Tensor:  # unit rows of d units from each base
            if d not in ar:
                ar[d] = torch.arange(d, device=device)
            return (base.unsqueeze(1) + ar[d]).reshape(-1)

        def elems(features: list[int], counts) -> int:
            return sum(counts[j] * self.all_entries[j].dim for j in features)

        # stage 1, owner: to each rank of its node, then over the rail to each other node, the
        # distinct rows of each local entry's block
        local_units = sum(e.dim for e in self.local_entries) // unit
        col = [0]
        for e in self.local_entries:
            col.append(col[-1] + e.dim // unit)
        nblocks = len(blocks)
        send_parts, block_elems = [], []
        for b, (start, _) in enumerate(blocks):
            total = 0
            for i, e in enumerate(self.local_entries):
                c = owner_counts[i * nblocks + b]
                send_parts.append(units((start + owner[i * nblocks + b].first[:c]) * local_units + col[i],
                                        e.dim // unit))
                total += c * e.dim
            block_elems.append(total)
        local_send_splits = block_elems[:L]
        rail_send_splits = block_elems[L:]
        rail_send_splits.insert(n, 0)  # nothing to this node over the rail
        # stage 1, receiver: from each rank k of its node the rows of k's features it uses
        local_recv_splits = [elems(self.features_of[r], own_counts) for r in node]
        # rail -> forwarder: from node m, the node-unique rows of its rail peer's entries (counts it sent)
        mine = self.remote_features[topo.local_rank]
        fwd = dict(zip(mine, fwd_counts))
        rail_recv_splits = [0 if m == n else elems(self.features_of[m * L + topo.local_rank], fwd)
                            for m in range(N)]
        # stage 2, receiver: from rank k the rows of rail k's remote features
        intra_recv_splits = [elems(self.remote_features[k], own_counts) for k in range(L)]
        own_count_tensor = (torch.stack([u.count.to(torch.int64) for u in own]) if own
                            else torch.zeros(0, dtype=torch.int64, device=device))
        # the node's ids of this rail's remote features, and every node rank's unique counts: the
        # counts' all-gather travels with stage 1 and, once it is in, launches the ids' all-to-all
        # (on the dist's own group: it may be launched off this thread); `complete` reads both
        counts = start_node_counts(step, topo, self.groups, own_count_tensor)
        ids_in_flight = counts.work.get_future().then(
            lambda _: start_node_ids(step, topo, self.remote_features, counts, self.groups.ids))

        def deferred() -> tuple[torch.Tensor, torch.Tensor]:
            t0 = time.perf_counter()
            ex = finish_node_ids(step, topo, self.remote_features, ids_in_flight.wait())
            t1 = time.perf_counter()
            step.stats.add_hop("ids", t1 - t0)
            widths = [max(1, max(ex.longest_of[k][j] for k in range(L))) for j in mine]
            fwd_specs = [BagBlock(f * NB, NB, widths[f], self.all_entries[j], self.all_entries[j].table in
                                  self.dedup_tables) for f, j in enumerate(mine)]
            uniques = blocks_unique(ex.values, _offsets(ex.lengths), ex.lengths, fwd_specs)
            chosen = node_subsets([u.inverse for u in uniques], [step.sizes[r] for r in node], NB)[0] \
                if uniques else None
            # stage 2, forwarder: to rank k the rows its bags use (k's own count) of each remote feature
            sub = [[ex.gathered_of[k][j] for j in mine] for k in range(L)]
            plan.intra_send_splits = [sum(sub[k][f] * self.all_entries[j].dim for f, j in enumerate(mine))
                                      for k in range(L)]
            rail_at, at = [], 0
            for f, j in enumerate(mine):
                rail_at.append(at)
                at += fwd_counts[f] * self.all_entries[j].dim // unit
            intra_send = [units(rail_at[f] + chosen[k, f, :sub[k][f]] * (self.all_entries[j].dim // unit),
                                self.all_entries[j].dim // unit)
                          for k in range(L) for f, j in enumerate(mine)]
            # where each feature's rows start in the receive buffer [stage 1 local | stage 2]
            base, at = {}, 0
            for groups in ([self.features_of[r] for r in node], self.remote_features):
                for features in groups:
                    for j in features:
                        base[j] = at
                        at += own_counts[j] * self.all_entries[j].dim // unit
            recv_parts = [base[j] + own[j].inverse.unsqueeze(1) * (e.dim // unit) + torch.arange(e.dim // unit,
                                                                                              device=device)
                          for j, e in enumerate(self.all_entries)]
            recv_index = torch.cat(recv_parts, dim=1).reshape(-1) if recv_parts else empty
            stats = step.stats
            stats.count_traffic(list(zip(node, plan.intra_send_splits, intra_recv_splits)), topo.rank,
                                topo.node_of, step.wire_bytes)
            stats.id_exchange_bytes += ex.exchanged_bytes
            stats.messages += ex.messages
            stats.add_hop("plan", time.perf_counter() - t1)
            return cat(intra_send), recv_index

        out_dim = sum(e.dim for e in self.all_entries)
        plan = TwoLevelPlan(unit, cat(send_parts), rail_send_splits, rail_recv_splits, None, None,
                            intra_recv_splits, None, (step.batch, out_dim), self.groups,
                            local_send_splits=local_send_splits, local_recv_splits=local_recv_splits,
                            deferred=deferred)
        return plan

    # ------------------------------------------------------------- counters
    def _account(self, step: DedupStep, blocks: list[tuple[int, int]], owner_counts: list[int],
                 own_counts: list[int]) -> None:
        """This step's bytes per table, as one-level dedup counts them: rows the owner sends (to its
        node's ranks, and the node-unique rows on its rail), rows reaching this rank; the ids of both
        all-to-alls. Bytes and messages of stage 1 are counted per message by the dist
        (`TwoLevelPlan.traffic`), stage 2's and the id exchange's by `TwoLevelPlan.complete`."""
        stats, wire, elem = step.stats, step.wire_bytes, step.elem_bytes
        okjt, skjt, sizes, B = step.owner_kjt, step.sample_kjt, step.sizes, step.batch
        owner_lengths = okjt.length_per_key() if self.local_entries else []
        for i, e in enumerate(self.local_entries):
            t = stats.table(e.table)
            for b, (_, n) in enumerate(blocks):
                t.add_rows(e.dim, wire, elem, sent=owner_counts[i * len(blocks) + b], stock_sent=n)
            t.id_recv_bytes += (owner_lengths[i] * okjt.values().element_size()
                                + sum(sizes) * okjt.lengths().element_size())
        sample_lengths = skjt.length_per_key() if self.all_entries else []
        for j, e in enumerate(self.all_entries):
            t = stats.table(e.table)
            t.add_rows(e.dim, wire, elem, received=own_counts[j], stock_received=B, bags=B)
            t.id_sent_bytes += (sample_lengths[j] * skjt.values().element_size()
                                + B * skjt.lengths().element_size())
        # the count exchange: one message to each other node's rail peer (its payload is not rows)
        others = self.topology.nodes - 1
        stats.messages += others
        stats.inter_node_messages += others
