"""What a dedup dist, its planner and its transport hand each other, once per step.

`DedupDist` (dist.py) wraps the step's inputs in a `DedupStep`; the planner of
its `Route` deduplicates the ids of both ends, adds the step's bytes to
`DedupStep.stats` and returns a `Plan` (flat: `DedupPlan`; two levels:
`two_level.shared.TwoLevelPlan`), which the route's transport carries out
forward and backward. The codec pairs planner and transport in the route, so
they cannot be mismatched. A plan depends on the ids only, so under the
pipeline it is made when the batch's ids arrive, a step early, and waits in a
`PlannedAhead`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Multistreamable

from dlrmtrain.comm import streams
from dlrmtrain.comm.dedup.kernels import Segments
from dlrmtrain.comm.layout import DistLayout
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.comm.topology import FLAT, Hierarchy, NodeTopology


@dataclass
class DedupStep:
    """One forward pass through a dedup dist: the planner's input."""

    owner_kjt: KeyedJaggedTensor
    """the ids this rank looked up, for every sample rank's bags (from the id all-to-all)"""
    sample_kjt: KeyedJaggedTensor
    """this rank's own batch: the bags whose pooled rows it receives"""
    sizes: list[int]
    """batch size per sample rank"""
    rank: int
    device: torch.device
    """where the embeddings (and so the plan's indices) live"""
    elem_bytes: int
    """bytes per embedding value: what `none` sends"""
    wire_bytes: int
    """bytes per value on the wire (2 under the LOSSY dedup+fp16/bf16)"""
    stats: DistCommStats
    """the dist's counters; the planner adds this step's bytes"""
    started_with_ids: Any = None
    """what the planner's `start_with_ids` launched when the ids left (row-wise: `RowFlags`)"""

    @property
    def batch(self) -> int:
        """this rank's batch size"""
        return self.sizes[self.rank]

    @property
    def global_batch(self) -> int:
        return sum(self.sizes)

    @property
    def starts(self) -> list[int]:
        """first global bag of each sample rank"""
        return [sum(self.sizes[:s]) for s in range(len(self.sizes))]

    def account_table_wise(self, layout: DistLayout, rank: int, sent: list[list[tuple[int, int]]],
                           received: list[int]) -> None:
        """Add this step's bytes to the per-table counters of a table-/column-wise dist (host
        integers only; one- and two-level dedup count alike): for each of `rank`'s owner entries,
        `sent[i]` lists (rows sent, rows `none` sends) per message; for each entry of the
        all-to-all, `received[j]` rows reach this rank (`none`: one per bag); the ids of both
        all-to-alls. Rows travel at `wire_bytes` a value against `elem_bytes` for `none`."""
        wire, elem, B = self.wire_bytes, self.elem_bytes, self.batch
        local_entries, all_entries = layout.entries_per_rank[rank], layout.all_entries()
        owner_lengths = self.owner_kjt.length_per_key() if local_entries else []
        ids, lengths = self.owner_kjt.values().element_size(), self.owner_kjt.lengths().element_size()
        # a column-wise table's rows count on its first shard
        for i, (entry, whole) in enumerate(zip(local_entries, layout.first_shard[rank], strict=True)):
            t = self.stats.table(entry.table)
            for rows, stock in sent[i]:
                t.add_rows(entry.dim, wire, elem, sent=rows, stock_sent=stock, whole=whole)
            t.id_recv_bytes += owner_lengths[i] * ids + self.global_batch * lengths
        sample_lengths = self.sample_kjt.length_per_key() if all_entries else []
        ids, lengths = self.sample_kjt.values().element_size(), self.sample_kjt.lengths().element_size()
        for j, (entry, whole) in enumerate(zip(all_entries, layout.all_first_shard(), strict=True)):
            t = self.stats.table(entry.table)
            t.add_rows(entry.dim, wire, elem, received=received[j], stock_received=B, bags=B, whole=whole)
            t.id_sent_bytes += sample_lengths[j] * ids + B * lengths


class Plan(Protocol):
    """What every plan offers its dist (flat `DedupPlan`, `TwoLevelPlan`); the rest is its transport's."""

    unit: int
    """columns per unit row: indices count unit rows, splits count elements"""
    out_shape: tuple[int, int]

    def traffic(self, topology: NodeTopology) -> list[tuple[int, int, int]]:
        """(peer rank, elements sent, elements received) of each forward message pair; backward mirrors."""
        ...


@dataclass
class DedupPlan(Multistreamable):
    """Everything one step's forward and backward transfers need, in units of `unit` columns."""

    unit: int
    send_index: torch.Tensor   # unit rows of local_embs, in message order
    recv_index: torch.Tensor   # per output unit row: its unit row in the receive buffer
    send_splits: list[int]     # elements per destination rank
    recv_splits: list[int]     # elements per source rank
    out_shape: tuple[int, int]
    pad_units: int = 0         # zero unit rows after the message (row-wise: what empty bags read)
    recv_segments: Segments | None = None
    """`recv_index` grouped by receive row, when the planner kept it from its sort (sequence
    dedup): the backward's gradient sums then sort nothing"""

    def traffic(self, topology: NodeTopology | None = None) -> list[tuple[int, int, int]]:
        """(peer rank, elements sent, elements received) of each forward message pair; backward mirrors."""
        return [(s, sent, received) for s, (sent, received) in enumerate(zip(self.send_splits, self.recv_splits))]

    def record_stream(self, stream) -> None:
        """Every tensor of the plan is used on `stream` (made ahead on the data-dist stream)."""
        streams.record_stream(self, stream)


@dataclass
class PlannedAhead(Multistreamable):
    """A plan made when its batch's ids arrived, before the forward that uses it."""

    plan: Plan | None
    """None: the planner declined (the pass runs the stock dist)"""
    elem_bytes: int
    """the embedding element size the bytes were counted at (the dist's last forward's)"""
    stats: DistCommStats
    """the plan's counters, added to the dist's when its pass runs (a batch that never runs counts nothing)"""
    seconds: float
    """time spent planning (codec time, off the critical path)"""

    def record_stream(self, stream) -> None:
        streams.record_stream(self, stream)


class DedupPlanner(Protocol):
    """The sharding-specific part of a dedup dist."""

    fallback_warning: str
    """logged once when `plan` first declines a step"""

    def plan(self, step: DedupStep) -> Plan | None:
        """This step's plan, with its bytes added to `step.stats`; None: run the stock dist this step."""
        ...


Start = Callable[[torch.Tensor, Any, Any], Any]
"""a transport: (local embeddings, plan, the dist) -> the awaitable of the output"""


@dataclass(frozen=True)
class Route:
    """How one dedup dist moves its rows: a planner and the transport that carries out its plans,
    paired by the codec (flat or two-level, table- or row-wise)."""

    planner: DedupPlanner
    start: Start
    topology: NodeTopology
    """which ranks share a node (flat routes use it only to count bytes between nodes)"""
    hierarchy: Hierarchy = FLAT
    """what the route runs: the run's node hierarchy for two levels, else FLAT"""
    plan_syncs: int = 1
    """host syncs one plan costs (two levels: the id exchange's and the counts')"""
