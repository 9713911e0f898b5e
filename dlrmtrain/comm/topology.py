"""Which ranks share a node, and the process groups of the two-level all-to-all.

Rank r sits on node r // L at local rank r % L, L ranks per node (torchrun
places ranks node by node). The two-level exchange (`comm.hierarchy: node`)
talks over two group families: the L ranks of one node (intra-node, the fast
fabric) and the ranks of one local rank across nodes (a "rail": each rank
talks between nodes only to its peer of every other node, rail-aligned as
HugeCTR and NCCL's PXN do). `dist.new_group` is collective over the whole
world and must be called in the same order everywhere, so every rank builds
every group, at setup, in one order (`make_node_groups`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import get_args

import torch
import torch.distributed as dist

from dlrmtrain.config.schema import CommConfig, HierarchyKind

HIERARCHIES = get_args(HierarchyKind)
"""`comm.hierarchy`: `flat` = one all-to-all over all ranks; `node` = two levels (intra-node, rails)"""


@dataclass(frozen=True)
class Hierarchy:
    """The comm config's topology choice: the one form it takes from the config to the codecs,
    their dists and their counters."""

    kind: HierarchyKind = "flat"
    """`flat` or `node` (`comm.hierarchy`)"""
    ranks_per_node: int | None = None
    """`comm.ranks_per_node`; None: torchrun's LOCAL_WORLD_SIZE, else one node"""

    @classmethod
    def of(cls, comm: CommConfig) -> Hierarchy:
        return cls(comm.hierarchy, comm.ranks_per_node)


FLAT = Hierarchy()


def ranks_per_node(configured: int | None, world_size: int) -> int:
    """Ranks per node: the config's, else torchrun's LOCAL_WORLD_SIZE, else the whole world."""
    if configured is not None:
        return configured
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(local) if local else world_size


def check_ranks_per_node(ranks: int, world_size: int, where: str = "comm.ranks_per_node") -> None:
    if ranks < 1 or world_size % ranks:
        raise ValueError(f"{where}: {ranks} ranks per node do not divide the {world_size} ranks "
                         f"into whole nodes")


@dataclass(frozen=True)
class NodeTopology:
    """Rank arithmetic of W ranks on W // L nodes of L ranks."""

    world_size: int
    ranks_per_node: int
    rank: int

    @property
    def nodes(self) -> int:
        return self.world_size // self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_of(self, rank: int) -> int:
        return rank % self.ranks_per_node

    @property
    def node(self) -> int:
        return self.node_of(self.rank)

    @property
    def local_rank(self) -> int:
        return self.local_of(self.rank)

    def node_ranks(self, node: int) -> list[int]:
        """The ranks of `node`, in local-rank order (its intra-node group)."""
        return list(range(node * self.ranks_per_node, (node + 1) * self.ranks_per_node))

    def rail_ranks(self, local_rank: int) -> list[int]:
        """The ranks with local rank `local_rank`, in node order (its rail group)."""
        return list(range(local_rank, self.world_size, self.ranks_per_node))


def topology_of(hierarchy: Hierarchy, pg: dist.ProcessGroup) -> NodeTopology:
    world = dist.get_world_size(pg)
    per_node = ranks_per_node(hierarchy.ranks_per_node, world)
    check_ranks_per_node(per_node, world)
    return NodeTopology(world, per_node, dist.get_rank(pg))


@dataclass(frozen=True)
class NodeGroups:
    """One two-level dist's groups: its node's ranks and its rail (shared by every dist), and a
    rail and a node group of its own for what it launches from a callback."""

    intra: dist.ProcessGroup
    rail: dist.ProcessGroup
    rail_grad: dist.ProcessGroup | None = None
    """the rail again, used only by one dist's backward rail hop, which is launched off the main
    thread when the node's gradients are in (two_level/transport.py): a group of its own keeps
    its order the same on every rank whatever the main thread launches meanwhile"""
    ids: dist.ProcessGroup | None = None
    """the node again, used only by one dist's id exchange, launched off the main thread when
    its counts are in (two_level/node_ids.py), for the same reason"""


LAUNCH_FAMILIES = ("rail", "node")
"""the groups a two-level dist may launch on from a callback: `NodeGroups.rail_grad`, `NodeGroups.ids`"""

_FAMILIES: dict[tuple[int, int], tuple[dist.ProcessGroup, dist.ProcessGroup]] = {}
"""(world group, L) → this rank's intra-node and rail groups, made once per process"""


def group_device(device: torch.device | None) -> torch.device | None:
    """`new_group`'s `device_id`: the GPU, so that NCCL creates each group at once (split from the
    default communicator, `distributed/env.group_options`) rather than inside its first
    collective; None on CPU, where torch refuses a CPU `device_id`."""
    return device if device is not None and device.type == "cuda" else None


def _new_groups(members: list[list[int]], mine: int, device: torch.device | None) -> dist.ProcessGroup:
    """Create one group per member list (every rank creates every group); return group `mine`."""
    groups = [dist.new_group(ranks, device_id=device) for ranks in members]
    return groups[mine]


def make_node_groups(topology: NodeTopology, pg: dist.ProcessGroup, launches: list[tuple[str, ...]],
                     device: torch.device | None = None) -> list[NodeGroups]:
    """The groups of every two-level dist of one sharded module (`launches[k]`: the
    `LAUNCH_FAMILIES` dist k launches on from a callback), made here at once, before any of
    its dists, in one order: the intra-node then the rail family (once per process and
    (world group, L)), then dist by dist (in dist order) its own rail, then its own node.

    Collective: `new_group` must be called by every rank for every group in the same order,
    and modules are sharded in the plan's order on every rank. The dists cannot share their
    callback groups: a callback launches when its future completes, on the thread that
    completes it, so two dists' launches on one group could meet in a different order on
    different ranks (and pair the wrong collectives); one group per dist and family keeps
    each group's launches in that dist's step order.
    """
    if dist.get_world_size(pg) != dist.get_world_size():
        raise ValueError("comm.hierarchy: node needs the sharding's process group to be the whole world")
    device = group_device(device)
    rails = [topology.rail_ranks(local) for local in range(topology.ranks_per_node)]
    nodes = [topology.node_ranks(n) for n in range(topology.nodes)]
    members = {"rail": (rails, topology.local_rank), "node": (nodes, topology.node)}
    key = (id(pg), topology.ranks_per_node)
    if launches and key not in _FAMILIES:
        _FAMILIES[key] = (_new_groups(nodes, topology.node, device), _new_groups(rails, topology.local_rank, device))
    made = []
    for families in launches:
        own = {f: _new_groups(*members[f], device) for f in LAUNCH_FAMILIES if f in families}
        made.append(NodeGroups(*_FAMILIES[key], own.get("rail"), own.get("node")))
    return made
