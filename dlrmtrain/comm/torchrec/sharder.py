"""TorchRec's sharder `shard()` call, repeated with our sharded module class (signatures recorded)."""

from __future__ import annotations

from typing import Any

import torch
from torchrec.distributed.embedding import EmbeddingCollectionSharder, ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder, ShardedEmbeddingBagCollection
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection


def _shard_signature(collection: str, sharded: str) -> str:
    """A sharder's `shard` signature as TorchRec 1.8.0 prints it: the same for both collection kinds
    but for the module's type and the sharded module's."""
    return (f"(self, module: torchrec.modules.embedding_modules.{collection}, "
            "params: Dict[str, torchrec.distributed.types.ParameterSharding], "
            "env: torchrec.distributed.types.ShardingEnv, device: Optional[torch.device] = None, "
            f"module_fqn: Optional[str] = None) -> torchrec.distributed.{sharded}")


SHARD_SIGNATURE = _shard_signature("EmbeddingBagCollection", "embeddingbag.ShardedEmbeddingBagCollection")
"""`EmbeddingBagCollectionSharder.shard` as of TorchRec 1.8.0, whose call `build_sharded` repeats"""
EC_SHARD_SIGNATURE = _shard_signature("EmbeddingCollection", "embedding.ShardedEmbeddingCollection")
"""`EmbeddingCollectionSharder.shard` as of TorchRec 1.8.0, whose call `build_sharded` repeats"""
SHARDED_EBC_PARAMETERS = ("self", "module", "table_name_to_parameter_sharding", "env", "fused_params",
                          "device", "qcomm_codecs_registry", "module_fqn", "sharded_module_order_overwrite")
"""`ShardedEmbeddingBagCollection.__init__`'s parameters as of TorchRec 1.8.0 (all passed below)"""
SHARDED_EC_PARAMETERS = ("self", "module", "table_name_to_parameter_sharding", "env", "fused_params",
                         "device", "qcomm_codecs_registry", "use_index_dedup", "module_fqn")
"""`ShardedEmbeddingCollection.__init__`'s parameters as of TorchRec 1.8.0 (all passed below)"""


def build_sharded(cls: type[ShardedEmbeddingBagCollection] | type[ShardedEmbeddingCollection],
                  sharder: EmbeddingBagCollectionSharder | EmbeddingCollectionSharder,
                  module: EmbeddingBagCollection | EmbeddingCollection, params, env: ShardingEnv,
                  device: torch.device | None, module_fqn: str | None, **extra: Any):
    """What the sharder's `shard` does (`EmbeddingBagCollectionSharder`'s or
    `EmbeddingCollectionSharder`'s), building `cls` with `extra` arguments."""
    if isinstance(sharder, EmbeddingCollectionSharder):
        extra.update(use_index_dedup=sharder._use_index_dedup)
    else:
        extra.update(sharded_module_order_overwrite=sharder._sharded_module_order_overwrite)
    return cls(
        module=module,
        table_name_to_parameter_sharding=params,
        env=env,
        fused_params=sharder.fused_params,
        device=device,
        qcomm_codecs_registry=sharder.qcomm_codecs_registry,
        module_fqn=module_fqn,
        **extra,
    )
