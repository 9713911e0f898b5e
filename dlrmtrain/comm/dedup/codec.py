"""The lossless `dedup` codec: only distinct pooled rows cross the all-to-all.

One output dist (`DedupDist`, dist.py) for every sharding type it
carries, with a planner per wire layout: table- and column-wise
(`TableWisePlanner`, table_wise.py, replacing TorchRec's all-to-all) and
row-wise (`RowWisePlanner`, row_wise.py, replacing its reduce-scatter).
Table-row-wise is not supported (the sharder falls back to `none`).

With `comm.hierarchy: node` (a `Hierarchy` of kind `node`) and more than one
node, every all-to-all travels in two levels (`TwoLevelPlanner`,
two_level.py; row-wise: `TwoLevelRowWisePlanner`, two_level_row_wise.py):
node-level unique rows over the rails between nodes, then inside each node.

Stacked with a lossy wire precision (`dedup+fp16`, `dedup+bf16`, LOSSY): the
unique rows, and backward their gradient sums, cross the wire rounded by the
same fbgemm casts TorchRec's qcomms use, so the forward equals that of `fp16` /
`bf16` alone bitwise and the bytes are the product of both savings.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from dlrmtrain.comm.codec import EmbeddingCommCodec
from dlrmtrain.comm.dedup.dist import DedupDist
from dlrmtrain.comm.dedup.plan import DedupPlanner
from dlrmtrain.comm.dedup.row_wise import RowWisePlanner
from dlrmtrain.comm.dedup.table_wise import TableWisePlanner
from dlrmtrain.comm.dedup.two_level import TwoLevelPlanner
from dlrmtrain.comm.dedup.two_level_row_wise import TwoLevelRowWisePlanner
from dlrmtrain.comm.dedup.two_level_transport import start_two_level_all_to_all
from dlrmtrain.comm.layout import DistLayout, Layout, RowWiseLayout
from dlrmtrain.comm.topology import FLAT, Hierarchy, NodeTopology, node_groups, topology_of

TWO_LEVEL_PLAN_SYNCS = 2
"""host syncs of one two-level plan: the node's id exchange and the unique counts (two_level*.py)"""


class DedupCodec(EmbeddingCommCodec):
    """Registry entry: `dedup`, or with `wire_dtype` (fp16 / bf16) the stacked, LOSSY `dedup+fp16/bf16`."""

    SHARDING_TYPES = frozenset({"table_wise", "column_wise", "table_column_wise", "row_wise"})
    _WIRE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    needs_ids = True  # both ends' KJTs, recorded by the sharder; per-id weights unsupported

    def __init__(self, wire_dtype: torch.dtype | None = None, hierarchy: Hierarchy = FLAT) -> None:
        self.wire_dtype = wire_dtype
        self.name = "dedup" if wire_dtype is None else f"dedup+{self._WIRE_NAMES[wire_dtype]}"
        self.lossless = wire_dtype is None
        if hierarchy.kind == "node" and wire_dtype is not None:
            raise ValueError(f"comm.hierarchy: node carries lossless {self.name!r} only, not {self.name!r}")
        self.hierarchy = hierarchy

    def supports(self, sharding_type: str) -> bool:
        return sharding_type in self.SHARDING_TYPES

    def wire_bytes_per_value(self) -> float:
        return torch.empty(0, dtype=self.wire_dtype).element_size() if self.wire_dtype is not None else 4.0

    def make_output_dist(self, stock_dist: nn.Module, layout: Layout | None, tables: set[str],
                         pg: dist.ProcessGroup, sharding_type: str) -> nn.Module:
        rank = dist.get_rank(pg)
        topology = self._topology(pg)
        two_level = self.hierarchy.kind == "node" and topology.nodes > 1
        planner: DedupPlanner
        if two_level and isinstance(layout, RowWiseLayout):
            plain = sorted({e.table for e in layout.entries} - tables)
            if plain:
                raise ValueError(f"comm.table_codecs: row-wise tables {plain} are 'none' but share the "
                                 f"reduce-scatter of {self.name!r} tables {sorted(tables)}; give all "
                                 f"row-wise tables the same codec")
            planner = TwoLevelRowWisePlanner(layout, topology, node_groups(topology, pg), pg)
            return DedupDist(stock_dist, planner, pg, sharding_type, {t: self.name for t in sorted(tables)}, None,
                             self.name, topology=topology, start=start_two_level_all_to_all, hierarchy="node",
                             plan_syncs=TWO_LEVEL_PLAN_SYNCS)
        if two_level and isinstance(layout, DistLayout):
            all_tables = {e.table for e in layout.all_entries()}
            table_codecs = {t: self.name if t in tables else "none" for t in sorted(all_tables)}
            planner = TwoLevelPlanner(layout, tables, topology, node_groups(topology, pg))
            return DedupDist(stock_dist, planner, pg, sharding_type, table_codecs, None, self.name,
                             topology=topology, start=start_two_level_all_to_all, hierarchy="node",
                             plan_syncs=TWO_LEVEL_PLAN_SYNCS)
        if isinstance(layout, RowWiseLayout):
            all_tables = {e.table for e in layout.entries}
            plain = sorted(all_tables - tables)
            if plain:
                raise ValueError(f"comm.table_codecs: row-wise tables {plain} are 'none' but share the "
                                 f"reduce-scatter of {self.name!r} tables {sorted(tables)}; give all "
                                 f"row-wise tables the same codec")
            planner = RowWisePlanner(layout, pg, rank)
        elif isinstance(layout, DistLayout):
            all_tables = {e.table for e in layout.all_entries()}
            plain = sorted(all_tables - tables)
            if self.wire_dtype is not None and plain:
                raise ValueError(f"comm.table_codecs: tables {plain} are 'none' but share an all-to-all with "
                                 f"{self.name!r} tables, whose lossy wire precision covers the whole message; "
                                 f"give them the same codec or shard them apart")
            planner = TableWisePlanner(layout, tables, rank)
        else:
            raise ValueError(f"comm codec {self.name!r}: no wire layout for {sharding_type} sharding")
        table_codecs = {t: self.name if t in tables else "none" for t in sorted(all_tables)}
        return DedupDist(stock_dist, planner, pg, sharding_type, table_codecs, self.wire_dtype, self.name,
                         topology=topology)

    def _topology(self, pg: dist.ProcessGroup) -> NodeTopology:
        """Ranks per node; flat runs only count bytes with it, so a world not made of whole
        nodes (e.g. LOCAL_WORLD_SIZE not dividing it) counts as one node there."""
        try:
            return topology_of(self.hierarchy, pg)
        except ValueError:
            if self.hierarchy.kind == "node":
                raise
            return NodeTopology(dist.get_world_size(pg), dist.get_world_size(pg), dist.get_rank(pg))
