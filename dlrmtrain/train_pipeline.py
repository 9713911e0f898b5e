"""`run.pipeline` → the pipeline object that runs the training steps.

Each has the same two calls: `progress(batches)` trains one step on the next batch of the
iterator (raising StopIteration once it is spent) and returns the model's outputs
(loss, logits, labels), and `detach()` gives the model to evaluate; so the trainer has
one loop. Every choice trains the plain loop's numbers (tests/multiproc/test_pipelines.py
checks the losses bitwise): batch i+1 is always looked up after batch i's embedding update.

- `off` (PlainLoop): one batch at a time, forward, backward, optimizer step.
- `sparse_dist` (TrainPipelineSparseDist): batch i+1's id all-to-all (the input dist)
  runs during batch i's forward and backward.
- `fused_sparse_dist` (TrainPipelineFusedSparseDist): that, and batch i's lookup and
  embedding all-to-all start at the top of its step, before the pipeline starts
  batch i+1's input dist and loads batch i+2, so the rows travel meanwhile (and, the
  model being sparse first, during the bottom MLP). Sound because the tables are
  updated inside the backward (fused optimizer), so nothing after it changes them,
  and the step's rate is handed to that update before the lookup (fbgemm takes the
  rate in effect at the lookup: comm.torchrec.pipelines.hand_rate_to_fused_tables).
  On CPU only (dlrmtrain.validation says why): TorchRec's class needs device streams,
  so dlrmtrain runs it through comm.torchrec.pipelines.StreamlessFusedSparseDist.

Refused ones (config/schema.py, validation.py): TrainPipelineSemiSync (one step stale);
the others TorchRec 1.8 ships add nothing on CPU or need a GPU: SparseDistLite (the
input dist back on the critical path), Prefetch (UVM-cached tables), PT2 and
CompAutograd (torch.compile), the experimental memory-stashing ones.
"""

from __future__ import annotations

from typing import Callable, Iterator, Union

import torch
from torchrec.distributed.train_pipeline import TrainPipeline

from dlrmtrain.comm.torchrec.pipelines import PlanAheadStreamlessFusedSparseDist, PlanAheadTrainPipelineSparseDist
from dlrmtrain.metrics.step_breakdown import NoStepBreakdown, StepBreakdown

Timer = Union[StepBreakdown, NoStepBreakdown]


class PlainLoop:
    """run.pipeline `off`: forward, backward (the embedding update happens inside it), dense
    update; each phase timed on its own (logging.step_breakdown)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 forward: Callable, timer: Timer) -> None:
        self.model, self.optimizer, self.forward, self.timer = model, optimizer, forward, timer

    def progress(self, batches: Iterator) -> tuple:
        batch = next(batches)  # StopIteration at the end of the data, as TorchRec's pipelines
        self.optimizer.zero_grad()  # also hands the new rate to the fused optimizer
        with self.timer.phase("forward"):
            loss, outputs = self.forward(batch)
        with self.timer.phase("backward"):
            loss.backward()
        with self.timer.phase("optimizer"):
            self.optimizer.step()
        return outputs

    def detach(self) -> torch.nn.Module:
        return self.model


class TorchRecPipeline:
    """A TorchRec train pipeline, its steps timed whole (`pipelined step`: its phases
    overlap). At the end of the data it drains the batches in flight by itself."""

    def __init__(self, pipeline: TrainPipeline, timer: Timer) -> None:
        self.pipeline, self.timer = pipeline, timer

    def progress(self, batches: Iterator) -> tuple:
        with self.timer.phase("pipelined step"):
            return self.pipeline.progress(batches)

    def detach(self) -> torch.nn.Module:
        return self.pipeline.detach()


def build_train_pipeline(mode: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         device: torch.device, forward: Callable, timer: Timer
                         ) -> Union[PlainLoop, TorchRecPipeline]:
    """The pipeline for run.pipeline `mode` (resolved: no `auto`) over the sharded `model`
    (its steps call `forward(batch)`, e.g. under autocast), timed by `timer`."""
    if mode == "off":
        return PlainLoop(model, optimizer, forward, timer)
    if mode == "sparse_dist":
        return TorchRecPipeline(PlanAheadTrainPipelineSparseDist(
            model, optimizer, device, custom_model_fwd=forward), timer)
    if mode == "fused_sparse_dist":
        return TorchRecPipeline(PlanAheadStreamlessFusedSparseDist(
            model, optimizer, device, custom_model_fwd=forward), timer)
    raise ValueError(f"run.pipeline: unknown mode {mode!r}")  # the loader checks the choices
