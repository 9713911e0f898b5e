"""The EmbeddingBagCollection sharder that installs codecs on TorchRec's output dists.

TorchRec 1.8 hook points used here (the only module touching its internals):
- `ShardedEmbeddingBagCollection.__init__` builds one output dist per sharding
  type (`_output_dists[i]`); we replace those a codec can carry.
- `_create_input_dist` / `input_dist`: we record each sharding's KJT slice
  before the id all-to-all (the sample rank's ids) into its sharding context.
- `compute_and_output_dist` (and `compute`): we put the KJT after the id
  all-to-all (the owner's ids) into the same context before TorchRec calls
  the dists.
Everything else (lookups, fused optimizer, state dict) is TorchRec's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionContext,
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from torchrec.distributed.types import ModuleSharder, ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.codecs.dedup import OWNER_FEATURES, SAMPLE_FEATURES
from dlrmtrain.comm.layout import DistLayout, RowWiseLayout, layout_of, row_wise_layout_of
from dlrmtrain.comm.registry import codecs_per_table, get_codec, is_qcomms, validate_codec_choice

logger = logging.getLogger(__name__)


class _RecordingInputDist(nn.Module):
    """Wraps a sharding's input dist and keeps the KJT it was last given.

    `input_dist` reads it back right after TorchRec's call, within the same
    step, so pipelining (several batches in flight) cannot mix batches up.
    """

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.last_input: KeyedJaggedTensor | None = None

    def forward(self, features: KeyedJaggedTensor):
        self.last_input = features
        return self.inner(features)


class CodecShardedEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """TorchRec's sharded EBC with codec output dists where the plan asks for them."""

    def __init__(self, *args: Any, table_codecs: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.codec_dists: list[nn.Module] = []
        for i, (sharding_type, sharding) in enumerate(zip(self._sharding_types, self._embedding_shardings)):
            layout = self._layout(sharding_type, sharding)
            tables = {info.embedding_config.name for info in self.sharding_type_to_sharding_infos[sharding_type]}
            by_codec: dict[str, set[str]] = {}
            for t in tables:
                by_codec.setdefault(table_codecs[t], set()).add(t)
            by_codec.pop("none", None)
            if not by_codec:
                continue
            if len(by_codec) > 1:
                raise ValueError(f"{sharding_type}: tables of one all-to-all use different codecs "
                                 f"{sorted(by_codec)}; one non-none codec per sharding type is supported")
            (name, coded), = by_codec.items()
            codec = get_codec(name)
            if not codec.supports(sharding_type) or (layout is None and getattr(codec, "needs_ids", False)):
                logger.warning("comm codec %r does not support %s sharding; tables %s use codec none",
                               name, sharding_type, sorted(coded))
                continue
            if self._is_weighted and getattr(codec, "needs_ids", False):
                raise ValueError(f"comm codec {name!r}: weighted (per-id weight) features are not supported")
            pg = self._env.process_group
            new_dist = codec.make_output_dist(self._output_dists[i], layout, coded, pg, sharding_type)
            if new_dist is not self._output_dists[i]:
                self._output_dists[i] = new_dist
                self.codec_dists.append(new_dist)
                logger.info("comm codec %r%s carries %s tables %s", name, "" if codec.lossless else " (LOSSY)",
                            sharding_type, sorted(coded))

    def _layout(self, sharding_type: str, sharding) -> DistLayout | RowWiseLayout | None:
        if sharding_type == "row_wise":
            return row_wise_layout_of(sharding, self._env.world_size)
        if sharding_type in ("table_wise", "column_wise", "table_column_wise"):
            return layout_of(sharding)
        return None

    def _create_input_dist(self, input_feature_names: list[str]) -> None:
        super()._create_input_dist(input_feature_names)
        self._input_dists = [_RecordingInputDist(d) for d in self._input_dists]

    def input_dist(self, ctx: EmbeddingBagCollectionContext, features: KeyedJaggedTensor):
        awaitable = super().input_dist(ctx, features)
        for recorder, sharding_ctx in zip(self._input_dists, ctx.sharding_contexts):
            setattr(sharding_ctx, SAMPLE_FEATURES, recorder.last_input)
            recorder.last_input = None
        return awaitable

    def _record_owner_features(self, ctx: EmbeddingBagCollectionContext, dist_input) -> None:
        for features, sharding_ctx in zip(dist_input, ctx.sharding_contexts):
            setattr(sharding_ctx, OWNER_FEATURES, features)

    def compute_and_output_dist(self, ctx: EmbeddingBagCollectionContext, input):
        self._record_owner_features(ctx, input)
        return super().compute_and_output_dist(ctx, input)

    def compute(self, ctx: EmbeddingBagCollectionContext, dist_input):
        # for callers that run compute() and output_dist() separately
        self._record_owner_features(ctx, dist_input)
        return super().compute(ctx, dist_input)


class CodecEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """`EmbeddingBagCollectionSharder` whose sharded module carries codec dists."""

    def __init__(self, codec: str, table_codecs: Mapping[str, str],
                 fused_params: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(fused_params=fused_params, **kwargs)
        self._codec = codec
        self._table_codecs = dict(table_codecs)

    def shard(self, module: EmbeddingBagCollection, params, env: ShardingEnv,
              device: torch.device | None = None, module_fqn: str | None = None):
        tables = [c.name for c in module.embedding_bag_configs()]
        return CodecShardedEmbeddingBagCollection(
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
            sharded_module_order_overwrite=self._sharded_module_order_overwrite,
            table_codecs=codecs_per_table(self._codec, self._table_codecs, tables),
        )

    @property
    def sharded_module_type(self):
        return CodecShardedEmbeddingBagCollection


def make_ebc_sharder(codec: str, table_codecs: dict[str, str], fused_params: dict,
                     device_type: str = "cpu") -> ModuleSharder:
    """The EBC sharder for a run: stock TorchRec for `none` everywhere, else ours.

    `codec` is the run's `comm.codec`; `table_codecs` per-table overrides keyed
    by table name; `fused_params` go to the fused embedding optimizer as usual;
    `device_type` ("cpu" / "cuda") picks TorchRec's qcomms kernels for the lossy
    codecs (`fp8` is refused off GPU).
    """
    validate_codec_choice(codec, table_codecs, device_type)
    if codec == "none" and all(c == "none" for c in table_codecs.values()):
        return EmbeddingBagCollectionSharder(fused_params=fused_params)
    lossy = sorted({codec, *table_codecs.values()} - {"none"} - {"dedup"})
    if lossy:
        logger.warning("comm codec %s is LOSSY: pooled embeddings and their gradients are rounded on the "
                       "wire, so training differs from comm.codec=none", ", ".join(lossy))
    registry = get_codec(codec).codecs_registry(device_type) if is_qcomms(codec) else None
    return CodecEmbeddingBagCollectionSharder(codec, table_codecs, fused_params=fused_params,
                                              qcomm_codecs_registry=registry)
