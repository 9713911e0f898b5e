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
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.nn as nn

from dlrmtrain.comm.declarations import CodecDeclaration, CollectionKind, Side, declaration_of
from dlrmtrain.comm.layout import DistLayout, Layout, RowWiseLayout, SequenceLayout
from dlrmtrain.comm.topology import FLAT, Hierarchy, NodeGroups

if TYPE_CHECKING:
    import torch
    from torchrec.distributed.fbgemm_qcomm_codec import QCommsConfig
    from torchrec.distributed.types import ModuleSharder, QuantizedCommCodecs

    from dlrmtrain.comm.stats import CommCounters

    from dlrmtrain.config.schema import AutoConfig

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


class SampleSide(ABC):
    """What a codec needs to run on one collection kind where the batch is made (`Side` "sample"),
    asked by comm/placement.py: TorchRec's stock dists carry what `transform` makes of each batch."""

    @abstractmethod
    def sharder(self, fused_params: dict[str, Any]) -> ModuleSharder:
        """TorchRec's sharder whose sharded module takes the transformed batches."""

    def install(self, model: nn.Module) -> None:
        """What the sharded `model` needs before its first step (default: nothing)."""

    @abstractmethod
    def transform(self, model: nn.Module, whole_tables: frozenset[str]) -> Callable:
        """The loader's batch transform (sparse features → what the stock dists carry) for the
        sharded `model`; `whole_tables` travel whole (where the codec's `whole_beside_at_sample` has the kind)."""

    def picker(self, device: torch.device, counters: CommCounters) -> Any:
        """None: every batch takes the transform; else the per-batch chooser the trainer asks
        (`pick(batch)`, `pick_for_eval(batch)`, `step_ended()`), its counters added to `counters`,
        and the loader keeps the full batch beside the transformed one."""
        return None


class EmbeddingCommCodec(ABC):
    """A codec's facts are `CodecDeclaration`'s fields (declarations.py), as attributes: a built-in
    codec takes its own from `declarations.BUILT_IN` (`declare`), where the config check reads
    them without torch; another codec says them itself (`name`, `lossless`, `dedups`, `sides`,
    `runs_under_two_levels`: no defaults) and `registry.register_codec` declares them."""

    name: str
    lossless: bool
    dedups: bool
    sides: frozenset[Side]
    runs_under_two_levels: bool
    qcomms: bool = False
    gpu_only: str | None = None
    whole_beside_at_sample: frozenset[CollectionKind] = frozenset()
    needs_ids: bool = False
    """True when its dists read both ends' ids (recorded by the sharder; no per-id weights)"""

    def declare(self, declaration: CodecDeclaration) -> None:
        """Take `declaration`'s facts as this codec's attributes (a built-in codec: its entry in
        `declarations.BUILT_IN`, the one place they are written)."""
        for name, value in vars(declaration).items():
            setattr(self, name, value)

    @property
    def declaration(self) -> CodecDeclaration:
        """What this codec declares (`declarations.declaration_of`)."""
        return declaration_of(self)

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

