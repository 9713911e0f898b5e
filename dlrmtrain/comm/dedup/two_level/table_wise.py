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

import functools
import math
import time

import torch
import torch.distributed as dist

from dlrmtrain.comm import timing
from dlrmtrain.comm.dedup.kernels import BlockUnique, expand_units, host_to_device, segment_units
from dlrmtrain.comm.dedup.plan import DedupStep
from dlrmtrain.comm.dedup.two_level.node_ids import NodeIds, exchange_node_ids
from dlrmtrain.comm.dedup.two_level.shared import (
    BagBlock,
    TwoLevelPlan,
    blocks_unique,
    node_subsets,
    offsets_of,
)
from dlrmtrain.comm.layout import DistLayout
from dlrmtrain.comm.topology import NodeGroups, NodeTopology


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
                parts.append(torch.stack([owner[i * nb + b].count for i in range(E)]).to(torch.int64)
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
        t0 = time.perf_counter()  # the host's clock: the plan holds the step's host sync, which it times
        blocks = self._owner_blocks(step)
        owner_specs, owner, own_specs, own = self._uniques(step, blocks)
        for attempt in range(2):
            overflow = torch.stack([u.overflow for u in owner + own]).any().to(torch.int64) \
                if owner + own else torch.zeros((), dtype=torch.int64, device=step.device)
            work, recv, _send = self._start_count_exchange(owner, overflow, step.device)
            # the step's first host sync: every count and flag of both ends, and what the rail peers sent
            uniques = owner + own
            mine = torch.cat([torch.stack([u.count for u in uniques]).to(torch.int64),
                              torch.stack([u.bad_ids for u in uniques]).to(torch.int64), overflow.view(1)]) \
                if uniques else overflow.view(1)
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
        plan = self.build_plan(step, blocks, owner, owner_counts, fwd_counts, own, own_counts)
        self.account(step, blocks, owner_counts, own_counts)
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

    def build_plan(self, step: DedupStep, blocks: list[tuple[int, int]], owner: list[BlockUnique],
               owner_counts: list[int], fwd_counts: list[int], own: list[BlockUnique],
               own_counts: list[int]) -> TwoLevelPlan:
        """Stage 1 now, and the node's id exchange launched; stage 2 once the rail hop is launched
        (`TwoLevelPlan.complete` runs `plan_stage_two`)."""
        topo, L, n = self.topology, self.topology.ranks_per_node, self.topology.node
        node = topo.node_ranks(n)
        block_elems, send_index = self._stage_one_send(step, blocks, owner, owner_counts)
        rail_send_splits = block_elems[L:]
        rail_send_splits.insert(n, 0)  # nothing to this node over the rail
        # from node m over the rail, the node-unique rows of its rail peer's entries (counts it sent)
        fwd = dict(zip(self.remote_features[topo.local_rank], fwd_counts))
        rail_recv_splits = [0 if m == n else self._elems(self.features_of[m * L + topo.local_rank], fwd)
                            for m in range(topo.nodes)]
        own_count_tensor = (torch.stack([u.count for u in own]).to(torch.int64) if own
                            else torch.zeros(0, dtype=torch.int64, device=step.device))
        # the node's ids of this rail's remote features, with every node rank's unique counts: in
        # flight with stage 1, read by stage 2's plan
        ids = exchange_node_ids(step, topo, self.groups, self.remote_features, gathered=own_count_tensor,
                                overlap=True)
        plan = TwoLevelPlan(self.unit, send_index, rail_send_splits, rail_recv_splits, None, None,
                            # stage 2, receiver: from rank k the rows of rail k's remote features
                            [self._elems(self.remote_features[k], own_counts) for k in range(L)],
                            None, (step.batch, sum(e.dim for e in self.all_entries)), self.groups,
                            local_send_splits=block_elems[:L],
                            local_recv_splits=[self._elems(self.features_of[r], own_counts) for r in node])
        plan.deferred = functools.partial(self.plan_stage_two, step, plan, ids, fwd_counts, own, own_counts)
        return plan

    def _elems(self, features: list[int], counts) -> int:
        """Elements of `counts[j]` rows of each feature j in `features`."""
        return sum(counts[j] * self.all_entries[j].dim for j in features)

    def _stage_one_send(self, step: DedupStep, blocks: list[tuple[int, int]], owner: list[BlockUnique],
                        owner_counts: list[int]) -> tuple[list[int], torch.Tensor]:
        """The owner's stage 1: to each rank of its node, then over the rail to each other node, the
        distinct rows of each local entry's block. Returns elements per block and the send index."""
        unit, nblocks = self.unit, len(blocks)
        local_units = sum(e.dim for e in self.local_entries) // unit
        col = [0]
        for e in self.local_entries:
            col.append(col[-1] + e.dim // unit)
        firsts = [u.first for u in owner]
        source = torch.cat(firsts) if firsts else torch.zeros(0, dtype=torch.int64, device=step.device)
        at = [0]
        for f in firsts:
            at.append(at[-1] + f.numel())
        segments, block_elems = [], []  # (offset in source, rows, unit added, units per row)
        for b, (start, _) in enumerate(blocks):
            total = 0
            for i, e in enumerate(self.local_entries):
                c = owner_counts[i * nblocks + b]
                segments.append((at[i * nblocks + b], c, start * local_units + col[i], e.dim // unit))
                total += c * e.dim
            block_elems.append(total)
        return block_elems, segment_units(source, segments, local_units)

    def plan_stage_two(self, step: DedupStep, plan: TwoLevelPlan, ids: NodeIds, fwd_counts: list[int],
                        own: list[BlockUnique], own_counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The forwarder's node-level unique from the exchanged ids; stage 2's send index and splits
        (set on `plan`), and the receive index of the expand."""
        topo, L, unit = self.topology, self.topology.ranks_per_node, self.unit
        node, mine = topo.node_ranks(topo.node), self.remote_features[topo.local_rank]
        NB = sum(step.sizes[r] for r in node)
        # no host sync from here on (stage 2's plan): timed on the device's clock (`comm.timing`)
        t0 = timing.stamp(step.device)
        ex = ids.wait()
        seconds, t1 = timing.since(t0, step.device)
        step.stats.add_time(None, seconds, "ids")
        widths = [max(1, max(ex.longest_of[k][j] for k in range(L))) for j in mine]
        fwd_specs = [BagBlock(f * NB, NB, widths[f], self.all_entries[j], self.all_entries[j].table in
                              self.dedup_tables) for f, j in enumerate(mine)]
        uniques = blocks_unique(ex.values, offsets_of(ex.lengths), ex.lengths, fwd_specs)
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
        # rank k's rows of feature f: rail_at[f] + chosen[k, f, :sub[k][f]] * d_f, d_f units each
        units_of = [self.all_entries[j].dim // unit for j in mine]
        F = len(mine)
        scaled = (chosen * host_to_device(units_of, step.device).view(1, F, 1)).view(-1) if F else \
            torch.zeros(0, dtype=torch.int64, device=step.device)
        intra_send = segment_units(scaled, [((k * F + f) * NB, sub[k][f], rail_at[f], units_of[f])
                                            for k in range(L) for f in range(F)], 1)
        stats = step.stats
        stats.count_traffic(list(zip(node, plan.intra_send_splits, plan.intra_recv_splits)), topo.rank,
                            topo.node_of, step.wire_bytes)
        stats.id_exchange_bytes += ex.exchanged_bytes
        stats.messages += ex.messages
        recv_index = self._recv_index(own, own_counts, step.device)
        stats.add_time(None, timing.since(t1, step.device)[0], "plan")
        return intra_send, recv_index

    def _recv_index(self, own: list[BlockUnique], own_counts: list[int], device: torch.device) -> torch.Tensor:
        """Per output unit row, its row in the receive buffer [stage 1 local | stage 2]."""
        node, unit = self.topology.node_ranks(self.topology.node), self.unit
        base, at = {}, 0
        for groups in ([self.features_of[r] for r in node], self.remote_features):
            for features in groups:
                for j in features:
                    base[j] = at
                    at += own_counts[j] * self.all_entries[j].dim // unit
        if not own:
            return torch.zeros(0, dtype=torch.int64, device=device)
        columns = [(j, e.dim // unit, base[j] + k) for j, e in enumerate(self.all_entries) for k in range(e.dim // unit)]
        return expand_units(torch.stack([u.inverse for u in own]), columns)

    # ------------------------------------------------------------- counters
    def account(self, step: DedupStep, blocks: list[tuple[int, int]], owner_counts: list[int],
                 own_counts: list[int]) -> None:
        """This step's bytes per table, as one-level dedup counts them: rows the owner sends (to its
        node's ranks, and the node-unique rows on its rail), rows reaching this rank; the ids of both
        all-to-alls. Bytes and messages of stage 1 are counted per message by the dist
        (`TwoLevelPlan.traffic`), stage 2's and the id exchange's by `TwoLevelPlan.complete`."""
        sent = [[(owner_counts[i * len(blocks) + b], n) for b, (_, n) in enumerate(blocks)]
                for i in range(len(self.local_entries))]
        step.account_table_wise(self.layout, self.rank, sent, own_counts)
        # the count exchange: one message to each other node's rail peer (its payload is not rows)
        others = self.topology.nodes - 1
        step.stats.messages += others
        step.stats.inter_node_messages += others
