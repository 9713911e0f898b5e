"""What the codec layer leaves in a TorchRec sharding context, and reads back.

Both id-recording sharded modules (pooled.py, sequence.py) leave both ends' ids there;
codec dists read them (`ids_of_both_ends`), launch work with them (`StartsWithIds`) and
plan a pass ahead from them (`PlansAhead`, the pipelines of pipelines.py).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


OWNER_FEATURES = "dlrmtrain_owner_features"
"""sharding-context attribute: the KJT the owner looked up (after the id all-to-all)"""
SAMPLE_FEATURES = "dlrmtrain_sample_features"
"""sharding-context attribute: this rank's own KJT slice (before the id all-to-all)"""
PLAN_AHEAD = "dlrmtrain_plan_ahead"
"""sharding-context attribute: the codec's plan for this pass, made when its ids arrived"""
STARTED_WITH_IDS = "dlrmtrain_started_with_ids"
"""sharding-context attribute: what an output dist launched with the ids (`StartsWithIds`)"""
CODEC_ATTRIBUTES = (OWNER_FEATURES, SAMPLE_FEATURES, PLAN_AHEAD, STARTED_WITH_IDS)
"""what the codec layer leaves in a sharding context"""


class RecordsOwnerIds:
    """Both id-recording sharded modules (EBC, EC) after the id all-to-all: the KJT the owner
    looks up is recorded as `OWNER_FEATURES` in each sharding context before TorchRec calls
    the output dists. Mixed in before TorchRec's sharded module class."""

    def _record_owner_features(self, ctx, dist_input) -> None:
        for features, sharding_ctx in zip(dist_input, ctx.sharding_contexts):
            setattr(sharding_ctx, OWNER_FEATURES, features)

    def compute_and_output_dist(self, ctx, input):
        self._record_owner_features(ctx, input)
        return super().compute_and_output_dist(ctx, input)

    def compute(self, ctx, dist_input):
        # for callers that run compute() and output_dist() separately
        self._record_owner_features(ctx, dist_input)
        return super().compute(ctx, dist_input)

    def plan_ahead(self, ctx, dist_input) -> None:
        """Record the owner's ids and let each codec dist that `PlansAhead` plan its pass now."""
        self._record_owner_features(ctx, dist_input)
        for out_dist, sharding_ctx in zip(self._output_dists, ctx.sharding_contexts):
            if isinstance(out_dist, PlansAhead):
                out_dist.plan_ahead(sharding_ctx)


def ids_of_both_ends(sharding_ctx) -> tuple[KeyedJaggedTensor | None, KeyedJaggedTensor | None]:
    """(owner's KJT, sample rank's KJT) recorded by `IdRecordingShardedEBC`, None where absent."""
    return getattr(sharding_ctx, OWNER_FEATURES, None), getattr(sharding_ctx, SAMPLE_FEATURES, None)


@runtime_checkable
class StartsWithIds(Protocol):
    """An output dist that launches something of its own when the ids leave for the id all-to-all
    (row-wise dedup: its "multi-id bag anywhere" flags), left in the context by `set_started_with_ids`."""

    def start_with_ids(self, sharding_ctx) -> None:
        ...


def set_started_with_ids(sharding_ctx, started: Any) -> None:
    setattr(sharding_ctx, STARTED_WITH_IDS, started)


def started_with_ids(sharding_ctx) -> Any:
    """What `StartsWithIds.start_with_ids` left in `sharding_ctx` (None if nothing)."""
    return getattr(sharding_ctx, STARTED_WITH_IDS, None)


def set_plan_ahead(sharding_ctx, plan: Any) -> None:
    setattr(sharding_ctx, PLAN_AHEAD, plan)


def take_plan_ahead(sharding_ctx) -> Any:
    """The plan `set_plan_ahead` left in `sharding_ctx` (None if none), removed so it serves one pass."""
    plan = getattr(sharding_ctx, PLAN_AHEAD, None)
    if plan is not None:
        setattr(sharding_ctx, PLAN_AHEAD, None)
    return plan


# ------------------------------------------------ planning at the pipeline's input stage
@runtime_checkable
class PlansAhead(Protocol):
    """An output dist that can plan a pass from its sharding context's ids alone (dedup's)."""

    def plan_ahead(self, sharding_ctx) -> None:
        """Plan the pass that will get `sharding_ctx` (both ends' ids recorded) and leave the plan in it."""
        ...
