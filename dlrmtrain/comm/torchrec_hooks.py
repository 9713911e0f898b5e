"""The one door to TorchRec's (and torch's) private internals (codec layer, train pipeline).

Every private attribute or method of TorchRec that dlrmtrain.comm reads,
replaces or overrides is reached through a named helper here, so a TorchRec
upgrade is checked against this file alone (comm/README.md, "TorchRec hook
points"). Importing it fails with a clear message on any TorchRec version
other than the one these hooks were written and tested against.

Where TorchRec's own call has to be repeated (the sharder's `shard()` builds
the sharded module with TorchRec's arguments plus ours),
tests/comm/test_torchrec_hooks.py compares TorchRec's signatures with the
ones recorded here and fails when they change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
import torch.nn as nn
import torchrec
from torchrec.distributed.comm_ops import Request, ReduceScatterV_Wait, reduce_scatter_v_per_feature_pooled
from torchrec.distributed.dist_data import (
    PooledEmbeddingsAwaitable,
    PooledEmbeddingsReduceScatter,
    VariableBatchPooledEmbeddingsReduceScatter,
)
from torchrec.distributed.embedding import (
    EmbeddingCollectionContext,
    EmbeddingCollectionSharder,
    ShardedEmbeddingCollection,
)
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionContext,
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
    VariableBatchEmbeddingBagCollectionAwaitable,
)
from torchrec.distributed.train_pipeline import TrainPipelineFusedSparseDist, TrainPipelineSparseDist
from torchrec.distributed.train_pipeline.runtime_forwards import InSyncEmbeddingPipelinedForward
from torchrec.distributed.train_pipeline.utils import _start_embedding_lookup
from torchrec.distributed.types import NoWait, ShardingEnv
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from dlrmtrain.comm import streams

SUPPORTED_TORCHREC = "1.8.0"


def check_torchrec_version(version: str) -> None:
    """Refuse a TorchRec whose internals these hooks were not checked against."""
    if version.split("+")[0] != SUPPORTED_TORCHREC:
        raise ImportError(
            f"dlrmtrain.comm hooks into TorchRec {SUPPORTED_TORCHREC} internals, but TorchRec {version} is "
            f"installed; install torchrec=={SUPPORTED_TORCHREC}, or re-check every helper in "
            f"dlrmtrain/comm/torchrec_hooks.py (see comm/README.md) and update SUPPORTED_TORCHREC")


check_torchrec_version(torchrec.__version__)

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


# ------------------------------------------------------------------ sharded EBC
def shardings(ebc: ShardedEmbeddingBagCollection) -> list[tuple[str, Any]]:
    """(sharding type, TorchRec sharding object) per output dist, in dist order."""
    return list(zip(ebc._sharding_types, ebc._embedding_shardings))


def output_dists(ebc: ShardedEmbeddingBagCollection) -> list[nn.Module]:
    """The output dist of each sharding, in `shardings` order."""
    return list(ebc._output_dists)


def replace_output_dist(ebc: ShardedEmbeddingBagCollection, i: int, new_dist: nn.Module) -> None:
    ebc._output_dists[i] = new_dist


def sharding_tables(ebc: ShardedEmbeddingBagCollection, sharding_type: str) -> set[str]:
    """Names of the tables sharded with `sharding_type`."""
    return {info.embedding_config.name for info in ebc.sharding_type_to_sharding_infos[sharding_type]}


def is_weighted(ebc: ShardedEmbeddingBagCollection) -> bool:
    """Whether the EBC takes per-id weights."""
    return ebc._is_weighted


def sharding_env(ebc: ShardedEmbeddingBagCollection) -> ShardingEnv:
    return ebc._env


# -------------------------------------------------------------------- shardings
def grouped_configs_per_rank(sharding) -> list[list[Any]]:
    """Table-/column-wise: each rank's grouped embedding configs, in wire order."""
    return sharding._grouped_embedding_configs_per_rank


def grouped_configs(sharding) -> list[Any]:
    """Row-wise: the grouped embedding configs every rank holds a row block of."""
    return sharding._grouped_embedding_configs


# --------------------------------------------------------------------- dists
def dist_callbacks(stock_dist: nn.Module) -> list:
    """The stock dist's output callbacks (column-wise: the shard reorder, differentiable)."""
    return list(getattr(stock_dist, "_callbacks", None) or [])


def qcomm_codecs(stock_dist: nn.Module):
    """The `QuantizedCommCodecs` a stock dist quantizes with, or None."""
    codecs = getattr(stock_dist, "_codecs", None)
    return codecs if codecs is not None else getattr(getattr(stock_dist, "_dist", None), "_codecs", None)


# -------------------------------------------------------------------- torch
def storage_use_count(t: torch.Tensor) -> int:
    """How many tensors/views share `t`'s storage (torch has no public accessor)."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


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


class _RecordsOwnerIds:
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


class IdRecordingShardedEBC(_RecordsOwnerIds, ShardedEmbeddingBagCollection):
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


class PlanAheadPipeline:
    """Mixin for TorchRec's `TrainPipelineSparseDist` (and its subclasses): the codec plans of
    batch i+1 are made during step i, after its optimizer step, once the ids of batch i+1 have
    arrived (the input all-to-all, launched before step i's backward, had that backward to finish).

    TorchRec's pipeline waits for those ids only inside the next forward; here they are
    waited for at the end of step i (`dequeue_batch`, the last thing `progress` does, after
    the backward and optimizer work of step i has been queued), each codec dist that
    `PlansAhead` plans from them, and the pipeline gets the ids back as an already-completed
    request. The step then does no unique, no sort and no host sync for the codec.
    Nothing changes numerically: a plan depends on the ids only.
    """

    def dequeue_batch(self) -> None:
        if len(self.contexts) >= 2:
            self._plan_ahead(self.contexts[1])
        super().dequeue_batch()

    def attach(self, model: nn.Module | None = None, sparse_dist: bool = True) -> None:
        # TorchRec re-runs the next batch's input dist into fresh module contexts (after an
        # eval on the detached model); its plans, made from the same ids, move over
        before = dict(self.contexts[0].module_contexts) if self.contexts else {}
        super().attach(model, sparse_dist)
        after = self.contexts[0].module_contexts if self.contexts else {}
        for name, old in before.items():
            new = after.get(name)
            if new is None or new is old:
                continue
            if isinstance(old, EmbeddingCollectionContext) or getattr(old, "variable_batch_per_feature", False):
                # the forward consumes the input dist started before the detach, which fills
                # the old context's sequence splits, or a variable batch's sizes per sample rank
                # (comm.dedup_at: source): keep it (the fresh one never gets them)
                after[name] = old
                continue
            for old_sharding, new_sharding in zip(getattr(old, "sharding_contexts", ()),
                                                  getattr(new, "sharding_contexts", ())):
                set_plan_ahead(new_sharding, take_plan_ahead(old_sharding))

    def _plan_ahead(self, context) -> None:
        for module in self._pipelined_modules:
            name = getattr(module.forward, "name", None)
            if not isinstance(module, (IdRecordingShardedEBC, IdRecordingShardedEC)) or name is None:
                continue
            request = context.input_dist_tensors_requests.get(name)
            module_ctx = context.module_contexts.get(name)
            if request is None or module_ctx is None:
                continue  # its input dist was not started (or already consumed)
            with self._stream_context(self._data_dist_stream):
                features = request.wait()
                module.plan_ahead(module_ctx, features)
            context.input_dist_tensors_requests[name] = NoWait(features)


class PlanAheadTrainPipelineSparseDist(PlanAheadPipeline, TrainPipelineSparseDist):
    """`TrainPipelineSparseDist` with the codec plans of batch i+1 made during step i."""


# ---------------------------------------------------------------- the sharder
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


# ------------------------------------------- sequence embeddings (EmbeddingCollection)
def ec_shardings(ec: ShardedEmbeddingCollection) -> list[tuple[str, Any]]:
    """(sharding type, TorchRec sequence sharding object) per output dist, in dist order.

    `output_dists`, `replace_output_dist` and `sharding_env` work on a sharded EC as on an EBC.
    """
    return list(zip(ec._sharding_types, ec._sharding_type_to_sharding.values()))


class IdRecordingShardedEC(_RecordsOwnerIds, ShardedEmbeddingCollection):
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


# ------------------------------------------------------------------ train pipelines
# TrainPipelineFusedSparseDist (run.pipeline: fused_sparse_dist) assumes device streams:
# it records the looked-up batch on the current stream, which a CPU tensor refuses, and
# its sharded-module forward asks CUDA for the current stream. Without streams nothing
# needs recording or waiting: the lookup runs in program order, after the previous
# step's backward (its fused embedding update) and optimizer step.
def _start_lookup_without_streams(module: nn.Module, context: Any) -> None:
    """TorchRec's `_start_embedding_lookup` for one pipelined module, no streams."""
    _start_embedding_lookup(module, context, source_stream=None, target_stream=None,
                            stream_context=torch.cuda.stream)  # stream(None): a no-op context


def hand_rate_to_fused_tables(optimizer: torch.optim.Optimizer) -> None:
    """Give the fused (in-backward) table optimizers the rate now in `optimizer`'s param groups.

    fbgemm's fused backward updates with the rate in effect when its lookup ran, and TorchRec's
    `EmbeddingFusedOptimizer` hands the param groups' rate to fbgemm only in `zero_grad` and
    `step`. TorchRec's fused pipeline looks batch i up before its `zero_grad`: without this, step
    i's tables would be updated at step i-1's rate (a warmup or decay schedule leaves the plain
    loop's numbers from the second step; a constant rate hides it). The dense gradients are
    cleared early, which nothing reads between the previous step and this one."""
    optimizer.zero_grad()


class _LookupStartedForward(InSyncEmbeddingPipelinedForward):
    """The sharded EBC's forward in the pipeline: the lookup and its all-to-all were started
    before the step; hand back their awaitable unwaited (TorchRec's waits here), so a
    sparse-first model still runs its bottom MLP while the rows travel."""

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        self._context.module_contexts.pop(self._name)
        return self._context.embedding_a2a_requests.pop(self._name)


class StreamlessFusedSparseDist(TrainPipelineFusedSparseDist):
    """TrainPipelineFusedSparseDist on a device without streams (CPU): batch i's lookup and
    embedding all-to-all start at the top of its step, then run while the pipeline starts
    batch i+1's id all-to-all and loads batch i+2, and during the bottom MLP."""

    _pipelined_forward_type = _LookupStartedForward

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 custom_model_fwd: Any = None) -> None:
        if device.type != "cpu":
            raise ValueError(f"StreamlessFusedSparseDist runs without device streams (CPU), "
                             f"not on {device.type}")
        super().__init__(model, optimizer, device, custom_model_fwd=custom_model_fwd,
                         pipeline_postproc=False)

    def start_embedding_lookup(self, batch: Any, context: Any) -> None:
        if batch is None:
            return
        hand_rate_to_fused_tables(self._optimizer)
        for module in self._pipelined_modules:
            _start_lookup_without_streams(module, context)


class PlanAheadStreamlessFusedSparseDist(PlanAheadPipeline, StreamlessFusedSparseDist):
    """`StreamlessFusedSparseDist` with the codec plans of batch i+1 made during step i."""


# =================================== pooled dedup at the source (comm.dedup_at: source, VBE)
# Everything `comm.dedup_at: source` reads of TorchRec's stock sharded EBC. The batch itself
# takes TorchRec's public variable-batch form (comm/dedup/source.py); only these are private.
def features_per_sharding_type(ebc: ShardedEmbeddingBagCollection) -> dict[str, dict[str, list[str]]]:
    """sharding type → {table: its feature names}, from `sharding_type_to_sharding_infos`."""
    return {st: {info.embedding_config.name: list(info.embedding_config.feature_names) for info in infos}
            for st, infos in ebc.sharding_type_to_sharding_infos.items()}


def lookups(ebc: ShardedEmbeddingBagCollection) -> list[nn.Module]:
    """The owner-side lookup module of each sharding (`_lookups`), in `shardings` order: each is
    called with the KJT the owner looks up (after the id all-to-all)."""
    return list(ebc._lookups)


# Row-wise tables at the source. TorchRec's variable-batch row-wise output dist reduce-scatters
# each sample rank's rows (uneven sizes: Gloo takes them), and its backward
# (`ReduceScatterV_Wait.backward`) all-gathers the gradient in those uneven sizes with
# `dist.all_gather`, which Gloo refuses ("all inputs must have the same size"). On Gloo the
# backward below gathers every rank's part padded to the longest (one even
# `all_gather_into_tensor`) and keeps each rank's own; NCCL takes the uneven all-gather. And
# TorchRec's dist serves one batch kind only (the first call's), where `auto` at the source
# sends both.
class _UnpadWork:
    """The padded all-gather's work: `wait` copies each rank's part out of its padded slot."""

    def __init__(self, work: dist.Work, gathered: torch.Tensor, parts: list[torch.Tensor]) -> None:
        self.work, self.gathered, self.parts = work, gathered, parts

    def wait(self) -> bool:
        self.work.wait()
        for part, slot in zip(self.parts, self.gathered.view(len(self.parts), -1)):
            part.copy_(slot[:part.numel()])
        return True


class _EvenAllGatherWait(ReduceScatterV_Wait):
    """`ReduceScatterV_Wait` whose backward all-gathers the 1-d gradient padded to the longest
    part (the variable-batch dist's `input_splits`, elements per rank; no codecs at the source)."""

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        myreq = ctx.myreq
        splits = list(myreq.rsi.input_splits)
        longest = max(splits)
        padded = grad_output.new_zeros(longest)
        padded[:grad_output.numel()] = grad_output.reshape(-1)
        gathered = grad_output.new_empty(len(splits) * longest)
        work = dist.all_gather_into_tensor(gathered, padded, group=ctx.pg, async_op=True)
        grad_input = grad_output.new_empty(myreq.rsi.total_input_size)
        myreq.req = _UnpadWork(work, gathered, list(torch.split(grad_input, splits)))
        myreq.tensor = grad_input
        return (None, None, myreq.dummy_tensor)


class _EvenGatherVariableBatchReduceScatter(VariableBatchPooledEmbeddingsReduceScatter):
    """TorchRec's variable-batch reduce-scatter, its backward gathering evenly (`_EvenAllGatherWait`)."""

    def forward(self, local_embs: torch.Tensor, batch_size_per_rank_per_feature: list[list[int]],
                embedding_dims: list[int]) -> PooledEmbeddingsAwaitable:
        request = reduce_scatter_v_per_feature_pooled(local_embs, batch_size_per_rank_per_feature,
                                                      embedding_dims, self._pg, self._codecs)
        if isinstance(request, Request):  # else one rank, or synchronous collectives: no all-gather
            request.wait_function = _EvenAllGatherWait
        return PooledEmbeddingsAwaitable(tensor_awaitable=request)


class _SourceRwPooledEmbeddingDist(RwPooledEmbeddingDist):
    """TorchRec's row-wise output dist taking a variable batch (dedup at the source) and a fixed one
    (`auto`'s `none` steps) on any call: TorchRec's builds the module of its first call's kind and
    keeps it. Over Gloo the variable-batch backward gathers evenly (`_EvenAllGatherWait`)."""

    def __init__(self, pg: dist.ProcessGroup, embedding_dims: list[int], qcomm_codecs_registry: Any,
                 even_gather: bool) -> None:
        super().__init__(pg, embedding_dims, qcomm_codecs_registry)
        variable = (_EvenGatherVariableBatchReduceScatter if even_gather
                    else VariableBatchPooledEmbeddingsReduceScatter)
        self._variable = variable(pg, self._codecs)
        self._fixed = PooledEmbeddingsReduceScatter(pg, self._codecs)

    def forward(self, local_embs: torch.Tensor, sharding_ctx=None):
        if sharding_ctx is not None and sharding_ctx.variable_batch_per_feature:
            return self._variable(local_embs, batch_size_per_rank_per_feature=sharding_ctx.batch_size_per_rank_per_feature,
                                  embedding_dims=self._embedding_dims)
        return self._fixed(local_embs, input_splits=None if sharding_ctx is None else sharding_ctx.batch_size_per_rank)


def row_wise_dists_for_source(ebc: ShardedEmbeddingBagCollection) -> int:
    """Give each stock row-wise output dist of `ebc` (no codec set) one that takes both batch kinds
    and, over Gloo, gathers the variable batch's gradient evenly; how many were given one."""
    given = 0
    for i, out_dist in enumerate(output_dists(ebc)):
        if type(out_dist) is RwPooledEmbeddingDist and out_dist._codecs is None:
            replace_output_dist(ebc, i, _SourceRwPooledEmbeddingDist(
                out_dist._pg, out_dist._embedding_dims, out_dist._qcomm_codecs_registry,
                even_gather=dist.get_backend(out_dist._pg) == "gloo"))
            given += 1
    return given


class ExpandRows(torch.autograd.Function):
    """`rows[index]`; the backward sums each row's gradients (`index_add`, in fp32 for 16-bit rows)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows_shape, ctx.rows_dtype = rows.shape, rows.dtype
        return rows.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors
        if grad.dtype in (torch.float16, torch.bfloat16):
            summed = torch.zeros(ctx.rows_shape, dtype=torch.float32, device=grad.device)
            return summed.index_add_(0, index, grad.float()).to(ctx.rows_dtype), None
        return torch.zeros(ctx.rows_shape, dtype=grad.dtype, device=grad.device).index_add_(0, index, grad), None


def _leading_slots(batch: int, per_sample: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[batch, per_sample]: the places of `ExpandRowsBehind`'s leading rows in its table (0, 1, ...),
    made once per shape and stream (the same every step) and only read. Per stream: on CUDA the
    `arange` runs on the stream current at its first use, and a read on another stream would have
    no event ordering it after that write."""
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else None
    return _leading_slots_on(batch, per_sample, dtype, device, stream)


@functools.lru_cache(maxsize=8)
def _leading_slots_on(batch: int, per_sample: int, dtype: torch.dtype, device: torch.device,
                      stream: int | None) -> torch.Tensor:
    return torch.arange(batch * per_sample, dtype=dtype, device=device).view(batch, per_sample)


class ExpandRowsBehind(torch.autograd.Function):
    """`cat((leading.unsqueeze(1), rows[index - n].view(B, -1, D)), 1)` in one gather: leading [B, D],
    rows [U, d] (d divides D: a column-wise table's shards, d < D, are a feature's D/d adjacent
    blocks), index [B, K] into rows, each entry plus n = B·D/d (the leading rows come first in the
    table the gather reads, `cat((leading as n rows of d, rows))`), give [B, 1 + K·d/D, D], each
    sample's leading row before its rows, as DLRM's interaction concatenates its dense row before
    the pooled ones (models/dlrm.py), without the expand's copy of B·K·d values and the
    concatenation's second one. Its backward reads the incoming gradient in place: the leading
    rows' gradient is its first block (the concatenation's backward, bitwise), and one
    `index_add` with the gather's own index sums each row's gradients (the leading places' sums
    are dropped): the rows' sums are `ExpandRows`'s, bitwise (same adds in the same order; fp32
    for 16-bit rows), without the copy that made the incoming gradient's row blocks contiguous."""

    @staticmethod
    def forward(ctx, leading: torch.Tensor, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        d, (B, D) = rows.size(1), leading.shape
        gather = torch.cat((_leading_slots(B, D // d, index.dtype, index.device), index), 1)
        ctx.save_for_backward(gather)
        ctx.rows_shape, ctx.rows_dtype, ctx.leading_rows = rows.shape, rows.dtype, B * (D // d)
        table = torch.cat((leading.reshape(-1, d), rows))
        return table.index_select(0, gather.view(-1)).view(B, -1, D)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (gather,) = ctx.saved_tensors
        (U, d), n = ctx.rows_shape, ctx.leading_rows
        wide = grad.dtype in (torch.float16, torch.bfloat16)
        flat = grad.reshape(-1, d)
        summed = torch.zeros(n + U, d, dtype=torch.float32 if wide else grad.dtype, device=grad.device)
        summed.index_add_(0, gather.view(-1), flat.float() if wide else flat)
        return grad[:, 0], summed[n:].to(ctx.rows_dtype), None


class ExpandedRows(KeyedTensor):
    """The one-width expand's output: TorchRec's KeyedTensor of values [B, K·d] = `rows[index]`
    (`ExpandRows`), gathered when its values are first read; `behind(leading)` gathers the rows
    behind a leading row per sample instead (`ExpandRowsBehind`: DLRM's interaction input).
    `index_at(offset)` makes the [B, K] index (`shape`), each entry plus `offset`, when needed."""

    def __init__(self, keys: list[str], dims: list[int], rows: torch.Tensor,
                 index_at: Callable[[int], torch.Tensor], shape: tuple[int, int]) -> None:
        self._rows, self._index_at, self._shape, self._expanded = rows, index_at, shape, None
        super().__init__(keys=keys, length_per_key=dims, values=None, key_dim=1)

    @property
    def _values(self) -> torch.Tensor:
        if self._expanded is None:
            self._expanded = ExpandRows.apply(self._rows, self._index_at(0).view(-1)).view(self._shape[0], -1)
        return self._expanded

    @_values.setter
    def _values(self, values: torch.Tensor | None) -> None:
        self._expanded = values

    def behind(self, leading: torch.Tensor) -> torch.Tensor | None:
        """[B, 1 + K·d/D, D]: each sample's `leading` row [D], then its rows in the keys' order;
        None where the values were gathered already (read before), or `leading` has another
        dtype than the rows (a concatenation would promote them) or a width D that d does
        not divide or that does not divide the sample's K·d values, or another batch size."""
        (B, K), d = self._shape, self._rows.size(1)
        if self._expanded is not None or leading.dtype != self._rows.dtype or leading.dim() != 2:
            return None
        D = leading.size(1)
        if not D or leading.size(0) != B or D % d or (K * d) % D:
            return None
        return ExpandRowsBehind.apply(leading, self._rows, self._index_at(B * (D // d)))


class _RowGatherExpand(VariableBatchEmbeddingBagCollectionAwaitable):
    """TorchRec's variable-batch EBC awaitable whose expand is one row gather.

    TorchRec's expands the distinct bags' pooled rows to the batch with fbgemm's
    `batch_index_select_dim0` and then reorders the features with `permute_pooled_embs`, whose
    CPU kernels loop per feature, forward and backward. When every pooled embedding has one
    width D, the received rows are a [bags, D] matrix, and output block k of sample b is its row
    base[k] + inverse[feature of k, b]: one gather gives the output in its final order (the
    same rows: bitwise TorchRec's), and its backward sums each distinct bag's gradients in one
    `index_add`. The gather puts the features in the batch's order (TorchRec's: grouped by
    sharding type), so a model in that order views the rows instead of reordering them (a
    copy of the whole output, forward and backward). The gather waits until the output is read
    (`ExpandedRows`), so a model that puts a row before each sample's (DLRM's interaction)
    gathers both in one. Widths that differ take TorchRec's path (`RowGatherExpandShardedEBC`)."""

    def _wait_impl(self) -> KeyedTensor:
        embeddings = [w.wait() for w in self._awaitables]
        for awaitable in self._resize_awaitables or ():
            awaitable.wait()
        rows = embeddings[0] if len(embeddings) == 1 else torch.cat(embeddings)
        block_of, _, names, dims = self._expand_order
        shape = (self._inverse_indices[1].size(1), len(block_of))
        return ExpandedRows(names, dims, rows.view(-1, self._uncombined_embedding_dims[0]), self._expand_index, shape)

    def _expand_index(self, offset: int = 0) -> torch.Tensor:
        """The [B, K] index of the gather, each entry plus `offset`, in two ops: the inverse rows
        in output order, plus each block's first row and `offset` (host ints: the bag counts)."""
        block_of, feature_of, _, _ = self._expand_order
        inverse = self._inverse_indices[1]
        firsts, first = [], 0
        for bags in self._batch_size_per_feature_pre_a2a:
            firsts.append(first)
            first += bags
        base = torch.tensor([firsts[u] + offset for u in block_of])
        if inverse.device.type != "cpu":
            base = base.pin_memory().to(inverse.device, non_blocking=True)
        return inverse.t().index_select(1, feature_of).add_(base)


class RowGatherExpandShardedEBC(ShardedEmbeddingBagCollection):
    """TorchRec's sharded EBC whose variable-batch (VBE) output is expanded by `_RowGatherExpand`
    (comm.dedup_at: source). Everything else, the non-VBE path included, is TorchRec's."""

    _expand_order: tuple[list[int], torch.Tensor, list[str], list[int]] | None = None
    """output block k: (its uncombined block, its feature's inverse row, the output's names, dims)"""

    def _row_gather(self, awaitable):
        if (not isinstance(awaitable, VariableBatchEmbeddingBagCollectionAwaitable)
                or len(set(self._uncombined_embedding_dims)) != 1):
            return awaitable
        if self._expand_order is None:
            self._expand_order = self._batch_ordered_blocks(awaitable._inverse_indices)
        awaitable.__class__ = _RowGatherExpand  # same state, our `_wait_impl`
        awaitable._expand_order = self._expand_order
        return awaitable

    def _batch_ordered_blocks(self, inverse_indices) -> tuple[list[int], torch.Tensor, list[str], list[int]]:
        """The output's blocks in the batch's feature order, a feature's column shards in column
        order (TorchRec's combined order is grouped by sharding type: its block k is uncombined
        block permute[k]); the features' names and dims in that order."""
        row = {name: i for i, name in enumerate(inverse_indices[0])}
        names = self._uncombined_embedding_names
        feature = {u: row[names[u].split("@")[0]] for u in self._permute_op._permute.tolist()}
        block_of = sorted(feature, key=feature.get)  # stable: a feature's shards keep TorchRec's combined order
        feature_of = torch.tensor([feature[u] for u in block_of])
        named = sorted(zip(self._embedding_names, self._embedding_dims), key=lambda nd: row[nd[0]])
        return (block_of, feature_of.to(inverse_indices[1].device), [n for n, _ in named], [d for _, d in named])

    def output_dist(self, ctx: EmbeddingBagCollectionContext, output):
        return self._row_gather(super().output_dist(ctx, output))

    def compute_and_output_dist(self, ctx: EmbeddingBagCollectionContext, input):
        return self._row_gather(super().compute_and_output_dist(ctx, input))


def vbe_metadata(B_offsets: torch.Tensor, B_offsets_rank_per_feature: torch.Tensor,
                 output_offsets_feature_rank: torch.Tensor, D_offsets: torch.Tensor, D: int, nobag: bool,
                 max_B_feature_rank: int, info_B_num_bits: int, total_B: int,
                 vbe_output_offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fbgemm's `generate_vbe_metadata` (its CPU kernel's outputs, fbgemm_gpu 1.8) in whole-tensor ops.

    fbgemm's CPU kernel indexes tensors element by element (two tensor ops per bag: ~0.5 s a
    call at 36k bags, ~3 ms here). Bag i (feature t, sample rank r, its b-th bag there, in
    (t, r, b) order) gets `row_output_offsets[i]` = the (r, t) block's output offset + b·D_t and
    `b_t_map[i]` = t << info_B_num_bits | (its bag number within feature t)."""
    del D, nobag, max_B_feature_rank  # the CPU kernel reads neither
    T = B_offsets.numel() - 1
    ranks = B_offsets_rank_per_feature.size(1) - 1
    starts = B_offsets_rank_per_feature.to(torch.int64)
    sizes = (starts[:, 1:] - starts[:, :-1]).reshape(-1)  # per (t, r), t major: bag order
    n = int(total_B)
    block = torch.repeat_interleave(torch.arange(T * ranks), sizes, output_size=n)
    feature, rank = block // ranks, block % ranks
    b = torch.arange(n) - (torch.cumsum(sizes, 0) - sizes)[block]
    dims = (D_offsets[1:] - D_offsets[:-1]).to(torch.int64)
    row_output_offsets = (output_offsets_feature_rank[rank * T + feature] + b * dims[feature]
                          ).to(output_offsets_feature_rank.dtype)
    b_t_map = ((feature << info_B_num_bits) | (starts[:, :-1].reshape(-1)[block] + b)).to(torch.int32)
    return (row_output_offsets if vbe_output_offsets is None else vbe_output_offsets), b_t_map


_VBE_KERNELS: list[torch.library.Library] = []
"""the library handle of the CPU `generate_vbe_metadata` kernel, kept alive"""


def register_cpu_vbe_metadata() -> None:
    """Replace fbgemm's CPU kernel of `fbgemm::generate_vbe_metadata` (called by the CPU TBE's
    variable-batch forward) with `vbe_metadata`, the same outputs; idempotent. CUDA keeps fbgemm's."""
    if _VBE_KERNELS:
        return
    import warnings

    import fbgemm_gpu  # noqa: F401 - declares the op and its CPU kernel

    lib = torch.library.Library("fbgemm", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        lib.impl("generate_vbe_metadata", vbe_metadata, "CPU")
    _VBE_KERNELS.append(lib)


# ====================== sequence dedup at the source (comm.dedup_at: source, distinct ids)
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


# ------------------------------------------------------------------ fbgemm's lookups on CPU
from fbgemm_gpu.split_embedding_configs import SparseType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: E402
    DenseTableBatchedEmbeddingBagsCodegen,
    SplitTableBatchedEmbeddingBagsCodegen,
)

_CPU_ROUNDED = {SparseType.BF16.as_int(): torch.bfloat16}
"""what fbgemm's CPU lookup cannot emit (`split_embedding_cpu_forward` has no BFloat16 output)"""


def round_cpu_lookups(model: nn.Module) -> int:
    """Make each CPU lookup kernel of `model` asked for bf16 rows emit them as the GPU's does:
    it sums in fp32 and its output is rounded once to bf16; the bf16 gradient that comes back
    is widened to fp32 for its backward, which accumulates in fp32 on both devices. The
    kernels that cross the all-to-all thus carry bf16 on CPU as on GPU. Returns how many."""
    rounded = 0
    kernels = (kernel for sharded in model.modules()
               if isinstance(sharded, (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection))
               for lookup in sharded._lookups for kernel in lookup.modules())  # a list: not submodules
    for module in kernels:
        if (isinstance(module, (SplitTableBatchedEmbeddingBagsCodegen, DenseTableBatchedEmbeddingBagsCodegen))
                and module.use_cpu and module.output_dtype in _CPU_ROUNDED):
            dtype = _CPU_ROUNDED[module.output_dtype]
            module.output_dtype = SparseType.FP32.as_int()
            module.register_forward_hook(functools.partial(_rounded_output, dtype=dtype))
            rounded += 1
    return rounded


def _rounded_output(_module: nn.Module, _inputs: Any, output: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return output.to(dtype)
