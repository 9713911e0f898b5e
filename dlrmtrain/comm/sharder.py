"""The EmbeddingBagCollection sharder that installs codecs on TorchRec's output dists.

TorchRec's `ShardedEmbeddingBagCollection` builds one output dist per sharding
type; ours replaces those a codec can carry, after TorchRec has built them.
The ids both ends of each all-to-all hold are recorded into the sharding
contexts by `IdRecordingShardedEBC`; every TorchRec internal this needs is
reached through torchrec_hooks.py (comm/README.md, "TorchRec hook points").
Everything else (lookups, fused optimizer, state dict) is TorchRec's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrmtrain.comm import torchrec_hooks as hooks
from dlrmtrain.comm.layout import layout_for
from dlrmtrain.comm.registry import codecs_per_table, get_codec, validate_codec_choice, validate_hierarchy
from dlrmtrain.comm.stats import CountsCommBytes
from dlrmtrain.comm.topology import FLAT, Hierarchy

logger = logging.getLogger(__name__)


class CodecShardedEmbeddingBagCollection(hooks.IdRecordingShardedEBC):
    """TorchRec's sharded EBC with codec output dists where the plan asks for them."""

    def __init__(self, *args: Any, table_codecs: Mapping[str, str], hierarchy: Hierarchy = FLAT,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the codec dists installed below (`stats.COUNTERS_ATTR`; count_stock_dists appends none's counters)
        self.comm_counters: list[CountsCommBytes] = []
        env = hooks.sharding_env(self)
        for i, (sharding_type, sharding) in enumerate(hooks.shardings(self)):
            by_codec: dict[str, set[str]] = {}
            for t in hooks.sharding_tables(self, sharding_type):
                by_codec.setdefault(table_codecs[t], set()).add(t)
            by_codec.pop("none", None)
            if not by_codec:
                continue
            if len(by_codec) > 1:
                raise ValueError(f"{sharding_type}: tables of one all-to-all use different codecs "
                                 f"{sorted(by_codec)}; one non-none codec per sharding type is supported")
            (name, coded), = by_codec.items()
            codec = get_codec(name, hierarchy=hierarchy)
            layout = layout_for(sharding_type, sharding, env.world_size)
            if not codec.supports(sharding_type) or (layout is None and codec.needs_ids):
                logger.warning("comm codec %r does not support %s sharding; tables %s use codec none",
                               name, sharding_type, sorted(coded))
                continue
            if codec.needs_ids and hooks.is_weighted(self):
                raise ValueError(f"comm codec {name!r}: weighted (per-id weight) features are not supported")
            stock = hooks.output_dists(self)[i]
            new_dist = codec.make_output_dist(stock, layout, coded, env.process_group, sharding_type)
            if new_dist is not stock:
                hooks.replace_output_dist(self, i, new_dist)
                self.comm_counters.append(new_dist)
                logger.info("comm codec %r%s carries %s tables %s", name, "" if codec.lossless else " (LOSSY)",
                            sharding_type, sorted(coded))


class CodecEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """`EmbeddingBagCollectionSharder` whose sharded module carries codec dists."""

    def __init__(self, codec: str, table_codecs: Mapping[str, str],
                 fused_params: dict[str, Any] | None = None, hierarchy: Hierarchy = FLAT, **kwargs: Any) -> None:
        super().__init__(fused_params=fused_params, **kwargs)
        self._codec = codec
        self._table_codecs = dict(table_codecs)
        self._hierarchy = hierarchy

    def shard(self, module: EmbeddingBagCollection, params, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None):
        tables = [c.name for c in module.embedding_bag_configs()]
        return hooks.build_sharded_ebc(
            CodecShardedEmbeddingBagCollection, self, module, params, env, device, module_fqn,
            table_codecs=codecs_per_table(self._codec, self._table_codecs, tables), hierarchy=self._hierarchy)

    @property
    def sharded_module_type(self):
        return CodecShardedEmbeddingBagCollection


def make_ebc_sharder(codec: str, table_codecs: dict[str, str], fused_params: dict,
                     device_type: str = "cpu", hierarchy: Hierarchy = FLAT) -> ModuleSharder:
    """The EBC sharder for a run: stock TorchRec for `none` everywhere, else ours.

    `codec` is the run's `comm.codec`; `table_codecs` per-table overrides keyed
    by table name; `fused_params` go to the fused embedding optimizer as usual;
    `device_type` ("cpu" / "cuda") picks TorchRec's qcomms kernels for the lossy
    codecs (`fp8` is refused off GPU); `hierarchy` (comm.hierarchy, comm.ranks_per_node)
    makes `dedup` two-level across nodes.
    """
    validate_codec_choice(codec, table_codecs, device_type)
    validate_hierarchy(hierarchy, codec, table_codecs)  # `hierarchy`: comm.hierarchy / comm.ranks_per_node
    if codec == "none" and all(c == "none" for c in table_codecs.values()):
        return EmbeddingBagCollectionSharder(fused_params=fused_params)
    lossy = sorted(n for n in {codec, *table_codecs.values()} if not get_codec(n).lossless)
    if lossy:
        logger.warning("comm codec %s is LOSSY: pooled embeddings and their gradients are rounded on the "
                       "wire, so training differs from comm.codec=none", ", ".join(lossy))
    return CodecEmbeddingBagCollectionSharder(codec, table_codecs, fused_params=fused_params, hierarchy=hierarchy,
                                              qcomm_codecs_registry=get_codec(codec).qcomm_codecs_registry(device_type))
