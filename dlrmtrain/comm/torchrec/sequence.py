"""The sharded EmbeddingCollection that lets codecs see the ids, and takes the loader's distinct ids
(TorchRec privates, sequence embeddings)."""

from __future__ import annotations

from typing import Any

import torch
from torchrec.distributed.embedding import EmbeddingCollectionContext, ShardedEmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.torchrec.contexts import SAMPLE_FEATURES, RecordsOwnerIds


def ec_shardings(ec: ShardedEmbeddingCollection) -> list[tuple[str, Any]]:
    """(sharding type, TorchRec sequence sharding object) per output dist, in dist order.

    `output_dists`, `replace_output_dist` and `sharding_env` work on a sharded EC as on an EBC.
    """
    return list(zip(ec._sharding_types, ec._sharding_type_to_sharding.values()))


class IdRecordingShardedEC(RecordsOwnerIds, ShardedEmbeddingCollection):
    """TorchRec's sharded EmbeddingCollection that leaves both ends' ids in each sharding context.

    TorchRec keeps the sample end's KJT itself (`features_before_input_dist`,
    unbucketized for row-wise); it is copied to `SAMPLE_FEATURES` after the input
    dist, and the owner's KJT (after the id all-to-all; row-wise: ids relative to
    this rank's row block) is recorded as `OWNER_FEATURES` before the output
    dists run, so `ids_of_both_ends` reads an EC's contexts like an EBC's.
    """

    def input_dist(self, ctx: EmbeddingCollectionContext, features: KeyedJaggedTensor):
        awaitable = super().input_dist(ctx, features)
        for sharding_ctx in ctx.sharding_contexts:
            setattr(sharding_ctx, SAMPLE_FEATURES, sharding_ctx.features_before_input_dist)
        return awaitable


def sequence_lengths_of_both_ends(sharding_ctx) -> tuple[torch.Tensor, torch.Tensor]:
    """(owner's lengths after the id all-to-all, sample rank's lengths before it) of a sequence sharding,
    as TorchRec's `SequenceShardingContext` keeps them for its stock dist (feature-major)."""
    return sharding_ctx.lengths_after_input_dist, sharding_ctx.features_before_input_dist.lengths()


# ================ sequence dedup at the source (the sample side: comm/placement.py, distinct ids)
# The sample rank's KJT comes deduplicated from the loader (comm/dedup/sequence_source.py): per
# sharding, each table's distinct ids over its features' slots, lengths not the samples'.
# TorchRec's own index dedup (`use_index_dedup`) sends the same kind of KJT through the same
# stock dists, and its `construct_jagged_tensors` expands the rows that come back with
# `ctx.input_features` (the real lengths) and `ctx.reverse_indices`: this module fills those two
# from the KJT's `expansion` instead of deduplicating on the step's thread.
def source_shardings(ec: ShardedEmbeddingCollection) -> list[tuple[str, list[str], dict[str, tuple[str, int]]]]:
    """Per sharding, in input-dist order: (sharding type, its features as TorchRec's permute and
    split hand them to it, feature → (table, rows))."""
    table_of = {f: (c.name, c.num_embeddings) for c in ec._embedding_configs for f in c.feature_names}
    return [(st, list(sharding.feature_names()), {f: table_of[f] for f in sharding.feature_names()})
            for st, sharding in ec_shardings(ec)]


def dedups_at_source(ec: ShardedEmbeddingCollection) -> bool:
    """Whether the sharded EC takes the loader's distinct ids (`SourceDedupShardedEC`)."""
    return isinstance(ec, SourceDedupShardedEC)


SOURCE_FEATURES = "dlrmtrain_source_features"
"""sharding-context attribute (dedup at the source): this rank's KJT slice as the batch has it"""


class SourceDedupShardedEC(IdRecordingShardedEC):
    """TorchRec's sharded EC (no index dedup) taking a KJT of distinct ids with its `expansion`:
    each sharding's real features and reverse indices go where TorchRec's index dedup puts them,
    so its awaitable expands the rows in one `index_select` per sharding. A KJT without one (a
    batch not made by the loader) is sent whole."""

    def input_dist(self, ctx: EmbeddingCollectionContext, features: KeyedJaggedTensor):
        expansion = getattr(features, "expansion", None)
        if expansion is not None and self._use_index_dedup:  # TorchRec's EC_INDEX_DEDUP flag: it would
            # dedup again and put its own context entries first, so the lengths would be wrong
            raise RuntimeError("dedup at the source: TorchRec's index dedup is on for this EC "
                               "(EC_INDEX_DEDUP?); a batch deduplicated by the loader cannot take it")
        awaitable = super().input_dist(ctx, features)
        if expansion is not None:
            if len(expansion.features) != len(ctx.sharding_contexts):
                raise RuntimeError(f"dedup at the source: the batch was deduplicated for "
                                   f"{len(expansion.features)} shardings, the EC has {len(ctx.sharding_contexts)}")
            ctx.input_features.extend(expansion.features)
            ctx.reverse_indices.extend(expansion.reverse)
            for sharding_ctx, before in zip(ctx.sharding_contexts, expansion.features):
                setattr(sharding_ctx, SOURCE_FEATURES, before)
        return awaitable


def source_lengths(sharding_ctx) -> torch.Tensor | None:
    """The sample rank's lengths before dedup at the source (`SourceDedupShardedEC`), None without it."""
    before = getattr(sharding_ctx, SOURCE_FEATURES, None)
    return None if before is None else before.lengths()
