"""The sharded EmbeddingBagCollection that lets codecs see the ids (TorchRec privates, pooled)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionContext, ShardedEmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm import streams
from dlrmtrain.comm.torchrec.contexts import (
    CODEC_ATTRIBUTES,
    SAMPLE_FEATURES,
    RecordsOwnerIds,
    StartsWithIds,
)


# ------------------------------------------------------------------ sharded EBC
def shardings(ebc: ShardedEmbeddingBagCollection) -> list[tuple[str, Any]]:
    """(sharding type, TorchRec sharding object) per output dist, in dist order."""
    return list(zip(ebc._sharding_types, ebc._embedding_shardings))


def sharding_tables(ebc: ShardedEmbeddingBagCollection, sharding_type: str) -> set[str]:
    """Names of the tables sharded with `sharding_type`."""
    return {info.embedding_config.name for info in ebc.sharding_type_to_sharding_infos[sharding_type]}


def is_weighted(ebc: ShardedEmbeddingBagCollection) -> bool:
    """Whether the EBC takes per-id weights."""
    return ebc._is_weighted


def features_per_sharding_type(ebc: ShardedEmbeddingBagCollection) -> dict[str, dict[str, list[str]]]:
    """sharding type → {table: its feature names}, from `sharding_type_to_sharding_infos`."""
    return {st: {info.embedding_config.name: list(info.embedding_config.feature_names) for info in infos}
            for st, infos in ebc.sharding_type_to_sharding_infos.items()}


def lookups(ebc: ShardedEmbeddingBagCollection) -> list[nn.Module]:
    """The owner-side lookup module of each sharding (`_lookups`), in `shardings` order: each is
    called with the KJT the owner looks up (after the id all-to-all)."""
    return list(ebc._lookups)


# -------------------------------------------- the EBC that lets codecs see the ids
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

    @property
    def _dist(self) -> nn.Module:
        """The inner dist's KJT all-to-all: TorchRec's pipeline looks for `input_dist._dist` to fuse
        every sharding's split exchange into one (`_override_input_dist_forwards`); hidden, each
        sharding would run its own. AttributeError (so `hasattr` is False) where the inner has none."""
        return self.inner._dist


class _CodecEBCContext(EmbeddingBagCollectionContext):
    """TorchRec's EBC context whose `record_stream` also reaches what the codec left in each sharding
    context (`CODEC_ATTRIBUTES`: the sample features, the plan made ahead on the data-dist stream):
    TorchRec's `EmbeddingShardingContext.record_stream` is a no-op."""

    def record_stream(self, stream: torch.Stream) -> None:
        super().record_stream(stream)
        streams.record_stream([[getattr(sharding_ctx, name, None) for name in CODEC_ATTRIBUTES]
                               for sharding_ctx in self.sharding_contexts], stream)


class IdRecordingShardedEBC(RecordsOwnerIds, ShardedEmbeddingBagCollection):
    """TorchRec's sharded EBC that leaves both ends' ids in each sharding context.

    Before the id all-to-all: this rank's KJT slice (`SAMPLE_FEATURES`); after
    it, the KJT the owner looks up (`OWNER_FEATURES`), set before TorchRec calls
    the output dists. Codec dists read them with `ids_of_both_ends`.
    """

    def _create_input_dist(self, input_feature_names: list[str]) -> None:
        super()._create_input_dist(input_feature_names)
        self._input_dists = [_RecordingInputDist(d) for d in self._input_dists]

    def create_context(self) -> EmbeddingBagCollectionContext:
        return _CodecEBCContext()

    def input_dist(self, ctx: EmbeddingBagCollectionContext, features: KeyedJaggedTensor):
        awaitable = super().input_dist(ctx, features)
        for recorder, sharding_ctx in zip(self._input_dists, ctx.sharding_contexts):
            setattr(sharding_ctx, SAMPLE_FEATURES, recorder.last_input)
            recorder.last_input = None
        for out_dist, sharding_ctx in zip(self._output_dists, ctx.sharding_contexts):
            if isinstance(out_dist, StartsWithIds):  # in program order on every rank, like the ids
                out_dist.start_with_ids(sharding_ctx)
        return awaitable
