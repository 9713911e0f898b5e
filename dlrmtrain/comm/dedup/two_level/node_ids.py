"""The node's id exchange of two-level dedup: each rank of a node gets its node peers' bags.

A forwarder p = (node n, local rank l) needs the ids of every bag of its
node for the features that the other nodes' ranks of its rail own, to compute
the same node-level unique as their owners. The ranks of a node exchange them
in two collectives on the intra-node group: an all-gather of per-feature id
counts and longest bags (and any values the caller adds: every rank's unique
counts), then, once those are read (a host sync), one all-to-all of lengths
and ids. `exchange_node_ids` runs both; `NodeIds.wait` regroups the ids
feature-major. Ids are 8 bytes where a row is 4·D.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from dlrmtrain.comm.dedup.kernels import host_to_device
from dlrmtrain.comm.dedup.plan import DedupStep
from dlrmtrain.comm.topology import NodeGroups, NodeTopology


@dataclass
class NodeExchange:
    """What `NodeIds.wait` returns: the node's bags of this rank's rail features, feature-major."""

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


class NodeIds:
    """The node's id exchange in flight; `wait` returns what it brought (`NodeExchange`)."""

    def __init__(self, step: DedupStep, topo: NodeTopology, rail_features: list[list[int]]) -> None:
        self._args = (step, topo, rail_features)
        self.ids: IdsInFlight | None = None
        """the ids' all-to-all, once launched"""
        self.launched: Any = None
        """overlapped: the future of the callback that launches it (its value is None)"""

    def wait(self) -> NodeExchange:
        if self.launched is not None:
            self.launched.wait()  # the callback has run: `ids` is set
        return finish_node_ids(*self._args, self.ids)


def exchange_node_ids(step: DedupStep, topo: NodeTopology, groups: NodeGroups, rail_features: list[list[int]],
                      gathered: torch.Tensor | None = None, extra: torch.Tensor | None = None,
                      overlap: bool = False) -> NodeIds:
    """Send each rank of the node the bags (lengths, ids) of the features in `rail_features[its local rank]`.

    One all-gather of per-feature id counts and longest bags (and `gathered`), the host sync
    that reads them (and `extra`), then one all-to-all of lengths and ids, all inside the node.
    With `overlap`, the all-to-all is launched by a callback when the counts are in, on the
    dist's own node group (`NodeGroups.ids`), so no rank blocks on its node peers before
    `NodeIds.wait`; else here, on the intra-node group.
    """
    counts = start_node_counts(step, topo, groups, gathered)
    pending = NodeIds(step, topo, rail_features)
    if not overlap:
        counts.work.wait()
        pending.ids = start_node_ids(step, topo, rail_features, counts, groups.intra, extra)
        return pending

    def launch_ids(_counts_in) -> None:
        # returns None, not the launch: a CUDA future extracts the tensors of a callback's
        # value (torch._jit_internal._extract_tensors), which an object holding a Work cannot give
        pending.ids = start_node_ids(step, topo, rail_features, counts, groups.ids, extra)

    pending.launched = counts.work.get_future().then(launch_ids)
    return pending
