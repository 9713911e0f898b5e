"""What both codec sharders (embeddingbag.py, embedding.py) share: the run's checked choice
(`codec_choice`) and the one loop that puts codec dists onto a sharded module's all-to-alls.

For each sharding (one output dist), the tables' codec (one non-`none` codec per
all-to-all) is asked, through `EmbeddingCommCodec.make_output_dist`, for the dist
that carries it; what it returns replaces TorchRec's and is listed as a counter.
Every TorchRec internal is reached through comm/torchrec/.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torchrec.distributed.types import ModuleSharder, ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dlrmtrain.comm.torchrec import pooled, sharded, sharder
from dlrmtrain.comm.codec import CollectionKind, DistSpec, EmbeddingCommCodec
from dlrmtrain.comm.layout import layout_for, sequence_layout_of
from dlrmtrain.comm.codec_choice import validate_codec_choice, validate_hierarchy
from dlrmtrain.comm.registry import codecs_per_table, get_codec, run_codecs, warn_if_lossy
from dlrmtrain.comm.stats import CommCounters, CountsCommBytes
from dlrmtrain.comm.topology import FLAT, Hierarchy, make_node_groups, topology_of
from dlrmtrain.config.schema import AutoConfig

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class CodecChoice:
    """A run's codecs, checked: what a codec sharder hands its sharded module."""

    codec: str
    table_codecs: dict[str, str]
    hierarchy: Hierarchy
    qcomm_codecs_registry: dict | None
    """TorchRec's qcomms for the whole sharder (the lossy fp16/bf16/int8/fp8), else None"""
    codecs: dict[str, EmbeddingCommCodec]
    """this run's codec of each name above (registry.run_codecs: `auto` with the run's comm.auto)"""

    def codecs_of(self, tables: Iterable[str]) -> dict[str, EmbeddingCommCodec]:
        """This run's codec of each of `tables` (a sharded module's)."""
        return {t: self.codecs[name] for t, name in codecs_per_table(self.codec, self.table_codecs, tables).items()}


class CodecSharder:
    """Put before TorchRec's EBC or EC sharder: `shard` builds `sharded_type`, TorchRec's sharded
    module recording the ids of both ends, and puts the codec dists of `choice` on its output
    dists, adding them to `counters` (the sharders of embeddingbag.py and embedding.py)."""

    sharded_type: type
    kind: CollectionKind
    stock_type: type
    """TorchRec's own sharder of the same collection, for a run whose tables are all `none`"""

    @classmethod
    def for_codecs(cls, codec: str, table_codecs: dict[str, str], fused_params: dict, device_type: str = "cpu",
                   hierarchy: Hierarchy = FLAT, auto: AutoConfig | None = None,
                   counters: CommCounters | None = None) -> ModuleSharder:
        """The run's sharder of this collection at the owner side: TorchRec's own for `none`
        everywhere, else this class with the checked choice.

        `codec` is the run's `comm.codec`; `table_codecs` per-table overrides keyed by table
        name; `fused_params` go to the fused embedding optimizer as usual; `device_type`
        ("cpu" / "cuda") picks TorchRec's qcomms kernels for the lossy codecs (`fp8` is refused
        off GPU); `hierarchy` (comm.hierarchy, comm.ranks_per_node) makes `dedup` two-level
        across nodes (pooled only: the sequence sharder refuses it); `auto` (comm.auto; None:
        the defaults) sets every `auto` dist's policy; the codec dists are added to `counters`
        (the run's; None: the sharder's own, `sharder.counters`)."""
        choice = codec_choice(codec, table_codecs, device_type, hierarchy, cls.kind, auto)
        if choice is None:
            return cls.stock_type(fused_params=fused_params)
        return cls(choice, CommCounters() if counters is None else counters, fused_params=fused_params)

    def __init__(self, choice: CodecChoice, counters: CommCounters,
                 fused_params: dict[str, Any] | None = None) -> None:
        super().__init__(fused_params=fused_params, qcomm_codecs_registry=choice.qcomm_codecs_registry)
        self._choice, self.counters = choice, counters

    @staticmethod
    def shardings_of(module: nn.Module) -> list[tuple[str, Any]]:
        """(sharding type, TorchRec sharding) per output dist of the sharded module."""
        raise NotImplementedError

    def shard(self, module: EmbeddingBagCollection | EmbeddingCollection, params, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None):
        configs = (module.embedding_bag_configs() if isinstance(module, EmbeddingBagCollection)
                   else module.embedding_configs())
        built = sharder.build_sharded(self.sharded_type, self, module, params, env, device, module_fqn)
        self.counters.add(*install_codec_dists(built, self.shardings_of(built),
                                               self._choice.codecs_of(c.name for c in configs),
                                               self._choice.hierarchy, self.kind, device))
        return built

    @property
    def sharded_module_type(self) -> type:
        return self.sharded_type


def codec_choice(codec: str, table_codecs: Mapping[str, str], device_type: str, hierarchy: Hierarchy,
                 kind: CollectionKind, auto: AutoConfig | None = None) -> CodecChoice | None:
    """The run's choice for `kind` embeddings, checked (errors name the config keys); None when
    every table is `none` (TorchRec's own sharder, untouched). Lossy codecs are warned about.
    `auto`: the run's comm.auto (None: its defaults)."""
    validate_codec_choice(codec, table_codecs, device_type)
    validate_hierarchy(hierarchy, codec, table_codecs, kind)
    if {codec, *table_codecs.values()} == {"none"}:
        return None
    warn_if_lossy(codec, table_codecs, f"{kind} embeddings")
    return CodecChoice(codec, dict(table_codecs), hierarchy, get_codec(codec).qcomm_codecs_registry(device_type),
                       run_codecs({codec, *table_codecs.values()}, auto))


def install_codec_dists(module: nn.Module, shardings: list[tuple[str, Any]],
                        table_codecs: Mapping[str, EmbeddingCommCodec],
                        hierarchy: Hierarchy, kind: CollectionKind,
                        device: torch.device | None = None) -> list[CountsCommBytes]:
    """Replace each output dist of `module` (one per (sharding type, TorchRec sharding), in dist order)
    that a codec carries (`table_codecs`: each table's, this run's instances: CodecChoice.codecs);
    returns the new dists. Two-level dists get their process groups first,
    all at once (`topology.make_node_groups`), on `device` (the module's)."""
    specs = [(i, codec, spec) for i, (sharding_type, sharding) in enumerate(shardings)
             for codec, spec in _spec_of(module, i, sharding_type, sharding, table_codecs, hierarchy, kind)]
    specs = _with_node_groups(specs, device)
    installed: list[CountsCommBytes] = []
    for i, codec, spec in specs:
        new_dist = codec.make_output_dist(spec)
        if new_dist is not spec.stock_dist:
            sharded.replace_output_dist(module, i, new_dist)
            installed.append(new_dist)
            logger.info("comm codec %r%s carries %s %s tables %s", codec.name, "" if codec.lossless else " (LOSSY)",
                        spec.sharding_type, kind, sorted(spec.tables))
    return installed


def _spec_of(module: nn.Module, i: int, sharding_type: str, sharding: Any,
             table_codecs: Mapping[str, EmbeddingCommCodec],
             hierarchy: Hierarchy, kind: CollectionKind) -> list[tuple[EmbeddingCommCodec, DistSpec]]:
    """The codec and spec of output dist `i`, if a codec carries it (else [])."""
    env = sharded.sharding_env(module)
    layout = layout_for(sharding_type, sharding, env.world_size)
    tables = pooled.sharding_tables(module, sharding_type) if kind == "pooled" else DistSpec.tables_of(layout)
    chosen = _codec_of(sharding_type, tables, table_codecs)
    if chosen is None:
        return []
    codec, coded = chosen
    if not codec.supports(sharding_type, kind) or (layout is None and codec.needs_ids):
        logger.warning("comm codec %r does not support %s %s sharding; tables %s use codec none",
                       codec.name, kind, sharding_type, sorted(coded))
        return []
    if codec.needs_ids and kind == "pooled" and pooled.is_weighted(module):
        raise ValueError(f"comm codec {codec.name!r}: weighted (per-id weight) features are not supported")
    if kind == "sequence" and layout is not None and codec.needs_ids:
        layout = sequence_layout_of(layout, env.rank)
    stock = sharded.output_dists(module)[i]
    return [(codec, DistSpec(stock, layout, frozenset(coded), env.process_group, sharding_type, kind, hierarchy))]


def _with_node_groups(specs: list[tuple[int, EmbeddingCommCodec, DistSpec]], device: torch.device | None
                      ) -> list[tuple[int, EmbeddingCommCodec, DistSpec]]:
    """The specs, each two-level one with its groups, all made here before any dist, in dist order
    (collective: the same order on every rank; see `make_node_groups` for why each has its own)."""
    two_level = [(k, families) for k, (_, codec, spec) in enumerate(specs)
                 if (families := codec.launch_families(spec)) is not None]
    if not two_level:
        return specs
    spec = specs[two_level[0][0]][2]
    topology = topology_of(spec.hierarchy, spec.pg)
    groups = make_node_groups(topology, spec.pg, [f for _, f in two_level], device)
    out = list(specs)
    for (k, _), g in zip(two_level, groups):
        i, codec, spec = out[k]
        out[k] = (i, codec, dataclasses.replace(spec, node_groups=g))
    return out


def _codec_of(sharding_type: str, tables: set[str], table_codecs: Mapping[str, EmbeddingCommCodec]
              ) -> tuple[EmbeddingCommCodec, set[str]] | None:
    """The one non-`none` codec of an all-to-all's tables and the tables it carries; None: all `none`."""
    by_codec: dict[str, set[str]] = {}
    for t in tables:
        by_codec.setdefault(table_codecs[t].name, set()).add(t)
    by_codec.pop("none", None)
    if not by_codec:
        return None
    if len(by_codec) > 1:
        raise ValueError(f"comm.table_codecs: {sharding_type} tables of one all-to-all ask for codecs "
                         f"{sorted(by_codec)}; give them one non-none codec")
    (coded,) = by_codec.values()
    return table_codecs[next(iter(coded))], coded
