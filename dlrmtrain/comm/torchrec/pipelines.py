"""TorchRec's train pipelines with the codec plans made ahead, and the fused one without streams."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torchrec.distributed.embedding import EmbeddingCollectionContext
from torchrec.distributed.train_pipeline import TrainPipelineFusedSparseDist, TrainPipelineSparseDist
from torchrec.distributed.train_pipeline.runtime_forwards import InSyncEmbeddingPipelinedForward
from torchrec.distributed.train_pipeline.utils import _start_embedding_lookup
from torchrec.distributed.types import NoWait

from dlrmtrain.comm.torchrec.contexts import set_plan_ahead, take_plan_ahead
from dlrmtrain.comm.torchrec.pooled import IdRecordingShardedEBC
from dlrmtrain.comm.torchrec.sequence import IdRecordingShardedEC


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
                # (dedup at the source): keep it (the fresh one never gets them)
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
