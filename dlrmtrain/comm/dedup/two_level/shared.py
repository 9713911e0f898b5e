"""What the two-level planners (table_wise.py, row_wise.py) share: the plan they hand the
transport (transport.py), and the unique bags per block and per rank of a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torchrec.streamable import Multistreamable

from dlrmtrain.comm import streams
from dlrmtrain.comm.dedup.kernels import BlockUnique, Segments, host_to_device
from dlrmtrain.comm.dedup.kernels import blocks_unique as keyed_blocks_unique
from dlrmtrain.comm.layout import FeatureEntry
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
    recv_segments: Segments | None = None
    """as `DedupPlan.recv_segments` (two-level planners keep none: the backward sorts)"""
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


def offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])


def unit_rows(base: torch.Tensor, d: int) -> torch.Tensor:
    """The unit rows of d units starting at each of `base`, in order."""
    return (base.unsqueeze(1) + torch.arange(d, device=base.device)).reshape(-1)


def cat_or_empty(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """`torch.cat(parts)`, or an empty int64 index when there are none."""
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)
