"""The EmbeddingCollection sharder that installs codecs on TorchRec's sequence-embedding dists.

The sequence counterpart of comm/sharder.py's EBC sharder: TorchRec's
`ShardedEmbeddingCollection` builds one sequence output dist per sharding type
(`TwSequenceEmbeddingDist`, `RwSequenceEmbeddingDist`, both around
`SequenceEmbeddingsAllToAll`); ours asks each sharding's codec for its dist
(install.py) after TorchRec built them: `dedup` a `DedupDist` run by a
`SequencePlanner` (planner.py), `auto` a `SequenceAutoDist` (auto.py); `none`
and TorchRec's lossy qcomms (`fp16`, `bf16`, `int8`, quantizing inside the stock
dist through the sharder's `qcomm_codecs_registry`) keep the stock dist. Both
ends' ids are recorded by `IdRecordingShardedEC` (torchrec_hooks.py). Lookups,
the fused optimizer and the state dict stay TorchRec's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingCollection

from dlrmtrain.comm import torchrec_hooks as hooks
from dlrmtrain.comm.codec import DistSpec
from dlrmtrain.comm.install import install_codec_dists
from dlrmtrain.comm.layout import layout_for
from dlrmtrain.comm.registry import (
    codecs_per_table,
    get_codec,
    is_qcomms,
    validate_codec_choice,
    validate_hierarchy,
    warn_if_lossy,
)
from dlrmtrain.comm.stats import CountsCommBytes
from dlrmtrain.comm.topology import FLAT, Hierarchy


class CodecShardedEmbeddingCollection(hooks.IdRecordingShardedEC):
    """TorchRec's sharded EC with codec sequence dists where the table codecs ask for them."""

    def __init__(self, *args: Any, table_codecs: Mapping[str, str], hierarchy: Hierarchy = FLAT,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        world = hooks.sharding_env(self).world_size
        shardings = []
        for sharding_type, sharding in hooks.ec_shardings(self):
            layout = layout_for(sharding_type, sharding, world)
            shardings.append((sharding_type, layout, DistSpec.tables_of(layout)))
        # the codec dists (`stats.COUNTERS_ATTR`)
        self.comm_counters: list[CountsCommBytes] = install_codec_dists(self, shardings, table_codecs,
                                                                        hierarchy, "sequence")


class CodecEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """`EmbeddingCollectionSharder` whose sharded module carries codec dists."""

    def __init__(self, codec: str, table_codecs: Mapping[str, str],
                 fused_params: dict[str, Any] | None = None, hierarchy: Hierarchy = FLAT, **kwargs: Any) -> None:
        super().__init__(fused_params=fused_params, **kwargs)
        self._codec = codec
        self._table_codecs = dict(table_codecs)
        self._hierarchy = hierarchy

    def shard(self, module: EmbeddingCollection, params, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None):
        tables = [c.name for c in module.embedding_configs()]
        return hooks.build_sharded_ec(
            CodecShardedEmbeddingCollection, self, module, params, env, device, module_fqn,
            table_codecs=codecs_per_table(self._codec, self._table_codecs, tables), hierarchy=self._hierarchy)

    @property
    def sharded_module_type(self):
        return CodecShardedEmbeddingCollection


def make_ec_sharder(codec: str, table_codecs: dict[str, str], fused_params: dict,
                    device_type: str = "cpu", hierarchy: Hierarchy = FLAT) -> ModuleSharder:
    """The EmbeddingCollection sharder for a run: TorchRec's own for `none` everywhere, else ours.

    Same arguments as `make_ebc_sharder` (comm/sharder.py); `comm.hierarchy: node` is refused
    (two levels carry pooled embeddings only).
    """
    validate_codec_choice(codec, table_codecs, device_type)
    validate_hierarchy(hierarchy, codec, table_codecs, kind="sequence")
    if {codec, *table_codecs.values()} == {"none"}:
        return EmbeddingCollectionSharder(fused_params=fused_params)
    warn_if_lossy(codec, table_codecs, "sequence embeddings")
    registry = get_codec(codec).qcomm_codecs_registry(device_type) if is_qcomms(codec) else None
    return CodecEmbeddingCollectionSharder(codec, table_codecs, fused_params=fused_params, hierarchy=hierarchy,
                                           qcomm_codecs_registry=registry)
