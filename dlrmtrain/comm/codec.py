"""The codec interface: everything the sharders, the registry and config validation ask of a codec.

A codec decides, per sharding type, whether it can carry an all-to-all and, if
so, builds the output dist that replaces TorchRec's, from one `DistSpec`:
the stock dist (for its process group and callbacks), the wire layout, the
tables it is asked to encode, whether the all-to-all carries pooled or
sequence embeddings, and the run's hierarchy. Both sharders (embeddingbag.py,
embedding.py) ask it through `install.py`, so a codec is the only
builder of its dists. TorchRec's own `QuantizedCommCodec` hook cannot express
a lossless, data-dependent codec (its message size must be a function of the
shape, and it never sees the ids), hence this interface of our own; codecs
that are TorchRec's qcomms say so through `qcomms_config`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch.distributed as dist
import torch.nn as nn

from dlrmtrain.comm.layout import DistLayout, Layout, RowWiseLayout, SequenceLayout
from dlrmtrain.comm.topology import FLAT, Hierarchy, NodeGroups

if TYPE_CHECKING:
    import torch
    from torchrec.distributed.fbgemm_qcomm_codec import QCommsConfig
    from torchrec.distributed.types import ModuleSharder, QuantizedCommCodecs

    from dlrmtrain.comm.stats import CommCounters

    from dlrmtrain.config.schema import AutoConfig

CollectionKind = Literal["pooled", "sequence"]
"""what an all-to-all carries: pooled rows (EmbeddingBagCollection) or one row per id (EmbeddingCollection)"""


def check_kind_takes_hierarchy(hierarchy: Hierarchy, kind: CollectionKind) -> None:
    """`comm.hierarchy: node` has a two-level route for pooled embeddings only: the one
    statement of the rule, asked by `registry.validate_hierarchy` (config validation, with
    the model family's `Workload.collection_kind`, and each sharder) and by the codecs."""
    if hierarchy.kind == "node" and kind != "pooled":
        raise ValueError("comm.hierarchy: node covers pooled embeddings only; sequence embeddings "
                         "take comm.hierarchy: flat")


@dataclass(frozen=True)
class DistSpec:
    """Everything a codec builds one output dist from."""

    stock_dist: nn.Module
    """TorchRec's dist for this sharding: the fallback, and what `none` keeps"""
    layout: Layout | SequenceLayout | None
    """pooled: a `DistLayout` (table-/column-wise) or `RowWiseLayout`; sequence: a `SequenceLayout`;
    None for sharding types without one"""
    tables: frozenset[str]
    """the tables this codec carries; the layout's others travel uncompressed"""
    pg: dist.ProcessGroup
    sharding_type: str
    kind: CollectionKind = "pooled"
    hierarchy: Hierarchy = FLAT
    """`comm.hierarchy` / `comm.ranks_per_node`, as validated"""
    node_groups: NodeGroups | None = None
    """a two-level dist's groups, made at setup with every other dist's (`topology.make_node_groups`)"""

    @property
    def rank(self) -> int:
        return dist.get_rank(self.pg)

    def all_tables(self) -> set[str]:
        """Every table of this all-to-all (the codec's and those left uncompressed)."""
        return self.tables_of(self.layout) if self.layout is not None else set(self.tables)

    @staticmethod
    def tables_of(layout: Layout | SequenceLayout | None) -> set[str]:
        """The tables of a wire layout (none without one)."""
        if isinstance(layout, DistLayout):
            return {e.table for e in layout.all_entries()}
        if isinstance(layout, RowWiseLayout):
            return {e.table for e in layout.entries}
        return set(layout.tables) if layout is not None else set()


Side = Literal["owner", "sample"]
"""where a codec's work on an all-to-all runs: at the `owner` (its output dist, after the id
all-to-all) or on the `sample` side (where the batch is made; TorchRec's stock dists carry what
it made): comm/placement.py"""

class SampleSide(ABC):
    """What a codec needs to run on one collection kind where the batch is made (`Side` "sample"),
    asked by comm/placement.py: TorchRec's stock dists carry what `transform` makes of each batch."""

    keeps_tables_whole: bool
    """whether tables whose codec does not dedup travel whole beside the codec's (pooled: their
    features keep their bags); else every table of the collection takes the run's codec"""

    @abstractmethod
    def sharder(self, fused_params: dict[str, Any]) -> ModuleSharder:
        """TorchRec's sharder whose sharded module takes the transformed batches."""

    def install(self, model: nn.Module) -> None:
        """What the sharded `model` needs before its first step (default: nothing)."""

    @abstractmethod
    def transform(self, model: nn.Module, whole_tables: frozenset[str]) -> Callable:
        """The loader's batch transform (sparse features → what the stock dists carry) for the
        sharded `model`; `whole_tables` travel whole (where `keeps_tables_whole`)."""

    def picker(self, device: torch.device, counters: CommCounters) -> Any:
        """None: every batch takes the transform; else the per-batch chooser the trainer asks
        (`pick(batch)`, `pick_for_eval(batch)`, `step_ended()`), its counters added to `counters`,
        and the loader keeps the full batch beside the transformed one."""
        return None


DECLARED = ("name", "lossless", "dedups", "sides", "runs_under_two_levels")
"""what every codec declares itself (no defaults: `check_declared`, asked at registration)"""


class EmbeddingCommCodec(ABC):
    name: str
    """the name used in config (`comm.codec`, `comm.table_codecs`)"""
    lossless: bool
    """True when training is the same as without the codec (up to float summation order)"""
    dedups: bool
    """True when it finds distinct rows (a run's unset placement is resolved only where one does)"""
    sides: frozenset[Side]
    """where its tables may travel (`Side`): "owner" through its output dist; "sample" where the
    batch is made (`none`: its tables travel whole either way)"""
    runs_under_two_levels: bool
    """whether it may be a table's codec under `comm.hierarchy: node` (two-level dists, or a table
    that travels whole); a lossy wire would round twice on the way"""
    needs_ids: bool = False
    """True when its dists read both ends' ids (recorded by the sharder; no per-id weights)"""

    def for_run(self, auto: AutoConfig | None) -> EmbeddingCommCodec:
        """This codec as a run uses it, with the run's `comm.auto` settings (None: the defaults)
        where it takes them; most codecs take none and are their own."""
        return self

    def sample_side(self, kind: CollectionKind) -> SampleSide:
        """What it needs to run on `kind` embeddings where the batch is made: asked only of a
        codec that dedups with "sample" in its `sides`."""
        raise ValueError(f"comm codec {self.name!r} does not run where the batch is made")

    def qcomms_config(self) -> QCommsConfig | None:
        """TorchRec's quantized-comms config when this codec is one (applies to the whole sharder), else None."""
        return None

    def qcomm_codecs_registry(self, device_type: str) -> dict[str, QuantizedCommCodecs] | None:
        """The `qcomm_codecs_registry` to hand TorchRec's sharder on `device_type`, or None."""
        return None

    def check_device(self, device_type: str, where: str = "comm.codec") -> None:
        """Raise a config-time error naming `where` if this codec cannot run on `device_type`."""

    def wire_bytes_per_value(self) -> float:
        """Bytes one fp32 embedding value takes on the wire."""
        return 4.0

    def launch_families(self, spec: DistSpec) -> tuple[str, ...] | None:
        """None when `spec`'s dist is not two-level; else the `topology.LAUNCH_FAMILIES` it
        launches on from a callback (its groups are made before any dist: `install.py`)."""
        return None

    @abstractmethod
    def supports(self, sharding_type: str, kind: CollectionKind = "pooled") -> bool:
        """Whether this codec can carry the `kind` all-to-all of `sharding_type`."""

    @abstractmethod
    def make_output_dist(self, spec: DistSpec) -> nn.Module:
        """The output dist carrying `spec.tables` with this codec (the rest travel uncompressed).

        Returning `spec.stock_dist` itself means "nothing to change".
        """


def check_declared(codec: EmbeddingCommCodec) -> None:
    """Refuse a codec that leaves one of `DECLARED` to a default: where it may run and whether
    it dedups or runs under two levels are its own to say, never derived (from `lossless`)."""
    missing = [a for a in DECLARED if not hasattr(codec, a)]
    if missing:
        raise TypeError(f"codec {type(codec).__name__} must declare {', '.join(missing)} "
                        f"(comm/README.md, \"Adding a codec\")")
    unknown = set(codec.sides) - {"owner", "sample"}
    if not codec.sides or unknown:
        raise TypeError(f"codec {codec.name!r}: sides must be a non-empty set of 'owner' and 'sample', "
                        f"got {sorted(codec.sides)}")
