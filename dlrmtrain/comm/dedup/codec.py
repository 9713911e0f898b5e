"""The lossless `dedup` codec: only distinct pooled rows cross the all-to-all.

One output dist (`DedupDist`, dist.py) for every all-to-all it carries,
with the `Route` (plan.py) the codec picks from the `DistSpec`: pooled
table- and column-wise (`TableWisePlanner`, table_wise.py, replacing
TorchRec's all-to-all), row-wise (`RowWisePlanner`, row_wise.py, replacing
its reduce-scatter), sequence table- and row-wise (`SequencePlanner`,
sequence.py), each with the flat transport (transport.py).
Table-row-wise is not supported (the sharder falls back to `none`).

With `comm.hierarchy: node` and more than one node, a pooled all-to-all
travels in two levels (two_level/: `TwoLevelPlanner`, row-wise
`TwoLevelRowWisePlanner`, with their own transport): node-level unique rows
over the rails between nodes, then inside each node.

Stacked with a lossy wire precision (`dedup+fp16`, `dedup+bf16`, LOSSY): the
unique rows, and backward their gradient sums, cross the wire rounded by the
same fbgemm casts TorchRec's qcomms use, so the forward equals that of `fp16` /
`bf16` alone bitwise and the bytes are the product of both savings.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from dlrmtrain.comm.codec import CollectionKind, DistSpec, EmbeddingCommCodec, SampleSide
from dlrmtrain.comm.codec_choice import check_kind_takes_hierarchy
from dlrmtrain.comm.declarations import BUILT_IN
from dlrmtrain.comm.dedup.dist import DedupDist
from dlrmtrain.comm.dedup.plan import Route
from dlrmtrain.comm.dedup.row_wise import RowWisePlanner
from dlrmtrain.comm.dedup.table_wise import TableWisePlanner
from dlrmtrain.comm.dedup.transport import flat_route
from dlrmtrain.comm.dedup.two_level.row_wise import TwoLevelRowWisePlanner
from dlrmtrain.comm.dedup.two_level.table_wise import TwoLevelPlanner
from dlrmtrain.comm.dedup.two_level.transport import two_level_route
from dlrmtrain.comm.layout import DistLayout, RowWiseLayout
from dlrmtrain.comm.dedup.sequence import SequencePlanner
from dlrmtrain.comm.topology import NodeTopology, topology_of


class DedupCodec(EmbeddingCommCodec):
    """Registry entry: `dedup`, or with `wire_dtype` (fp16 / bf16) the stacked, LOSSY `dedup+fp16/bf16`."""

    SHARDING_TYPES = {"pooled": frozenset({"table_wise", "column_wise", "table_column_wise", "row_wise"}),
                      # column-wise sequence tables keep the stock dist (logged)
                      "sequence": frozenset({"table_wise", "row_wise"})}
    _WIRE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    needs_ids = True  # both ends' KJTs, recorded by the sharder; per-id weights unsupported

    def __init__(self, wire_dtype: torch.dtype | None = None) -> None:
        self.wire_dtype = wire_dtype
        # the stacks round on the owner's wire: at the owner only, one level; plain dedup also
        # runs where the batch is made (declarations.BUILT_IN)
        self.declare(BUILT_IN["dedup" if wire_dtype is None else f"dedup+{self._WIRE_NAMES[wire_dtype]}"])

    def supports(self, sharding_type: str, kind: CollectionKind = "pooled") -> bool:
        return sharding_type in self.SHARDING_TYPES[kind]

    def sample_side(self, kind: CollectionKind) -> SampleSide:
        """Where the batch is made: each feature's distinct bags (pooled, source.py) or each
        table's distinct ids (sequence, sequence_source.py)."""
        if "sample" not in self.sides:
            return super().sample_side(kind)
        if kind == "pooled":
            from dlrmtrain.comm.dedup.source import PooledSourceSide

            return PooledSourceSide()
        from dlrmtrain.comm.dedup.sequence_source import SequenceSourceSide

        return SequenceSourceSide()

    def wire_bytes_per_value(self) -> float:
        return torch.empty(0, dtype=self.wire_dtype).element_size() if self.wire_dtype is not None else 4.0

    def make_output_dist(self, spec: DistSpec) -> nn.Module:
        return DedupDist(spec, self.route(spec), self.name, self.wire_dtype)

    def route(self, spec: DistSpec) -> Route:
        """The planner and transport for `spec`'s all-to-all."""
        self._check(spec)
        topology = self._topology(spec)
        if spec.kind == "sequence":
            return flat_route(SequencePlanner(spec.layout, spec.rank), topology)
        if self.launch_families(spec) is not None:
            groups = spec.node_groups
            if groups is None:
                raise RuntimeError(f"two-level {spec.sharding_type} dist built without its groups: "
                                   "install.install_codec_dists makes every dist's at setup")
            planner = (TwoLevelRowWisePlanner(spec.layout, topology, groups, spec.pg)
                       if isinstance(spec.layout, RowWiseLayout)
                       else TwoLevelPlanner(spec.layout, set(spec.tables), topology, groups))
            return two_level_route(planner, topology, spec.hierarchy)
        if isinstance(spec.layout, RowWiseLayout):
            return flat_route(RowWisePlanner(spec.layout, spec.pg, spec.rank), topology)
        return flat_route(TableWisePlanner(spec.layout, set(spec.tables), spec.rank), topology)

    def launch_families(self, spec: DistSpec) -> tuple[str, ...] | None:
        """Two levels: the backward rail hop's rail, and table-/column-wise the id exchange's node
        (row-wise exchanges its ids on the main thread)."""
        if spec.kind != "pooled" or spec.hierarchy.kind != "node" or self._topology(spec).nodes <= 1:
            return None
        return ("rail",) if isinstance(spec.layout, RowWiseLayout) else ("rail", "node")

    def _check(self, spec: DistSpec) -> None:
        """Refuse what this codec cannot carry as `spec` asks (the errors name the config keys)."""
        plain = sorted(spec.all_tables() - spec.tables)
        check_kind_takes_hierarchy(spec.hierarchy, spec.kind)
        if spec.hierarchy.kind == "node" and self.wire_dtype is not None:
            raise ValueError(f"comm.hierarchy: node carries lossless 'dedup' only, not {self.name!r}")
        if not isinstance(spec.layout, (DistLayout, RowWiseLayout)) and spec.kind == "pooled":
            raise ValueError(f"comm codec {self.name!r}: no wire layout for {spec.sharding_type} sharding")
        if plain and (spec.kind == "sequence" or isinstance(spec.layout, RowWiseLayout)):
            what = "sequence" if spec.kind == "sequence" else "row-wise"
            raise ValueError(f"comm.table_codecs: {spec.sharding_type} {what} tables {sorted(spec.all_tables())} "
                             f"share one all-to-all but ask for codecs {sorted({self.name, 'none'})} ({plain} "
                             f"'none'); give them one codec")
        if plain and self.wire_dtype is not None:
            raise ValueError(f"comm.table_codecs: tables {plain} are 'none' but share an all-to-all with "
                             f"{self.name!r} tables, whose lossy wire precision covers the whole message; "
                             f"give them the same codec or shard them apart")

    def _topology(self, spec: DistSpec) -> NodeTopology:
        """Ranks per node; flat runs only count bytes with it, so a world not made of whole
        nodes (e.g. LOCAL_WORLD_SIZE not dividing it) counts as one node there, as do sequence
        all-to-alls."""
        world = dist.get_world_size(spec.pg)
        if spec.kind == "sequence":
            return NodeTopology(world, world, spec.rank)
        try:
            return topology_of(spec.hierarchy, spec.pg)
        except ValueError:
            if spec.hierarchy.kind == "node":
                raise
            return NodeTopology(world, world, spec.rank)
