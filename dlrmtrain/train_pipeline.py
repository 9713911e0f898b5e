"""`run.pipeline` → the TorchRec train pipeline that runs the steps (None: the plain loop).

Every choice trains the plain loop's numbers (tests/multiproc/test_pipelines.py checks
the losses bitwise): batch i+1 is always looked up after batch i's embedding update.

- `sparse_dist` (TrainPipelineSparseDist): batch i+1's id all-to-all (the input dist)
  runs during batch i's forward and backward.
- `fused_sparse_dist` (TrainPipelineFusedSparseDist): that, and batch i's lookup and
  embedding all-to-all start at the top of its step, before the pipeline starts
  batch i+1's input dist and loads batch i+2, so the rows travel meanwhile (and, the
  model being sparse first, during the bottom MLP). Sound because the tables are
  updated inside the backward (fused optimizer), so nothing after it changes them,
  and the step's rate is handed to that update before the lookup (fbgemm takes the
  rate in effect at the lookup: comm.torchrec_hooks.hand_rate_to_fused_tables).
  On CPU only (dlrmtrain.validation says why): TorchRec's class needs device streams,
  so dlrmtrain runs it through comm.torchrec_hooks.StreamlessFusedSparseDist.

Refused ones (config/schema.py, validation.py): TrainPipelineSemiSync (one step stale);
the others TorchRec 1.8 ships add nothing on CPU or need a GPU: SparseDistLite (the
input dist back on the critical path), Prefetch (UVM-cached tables), PT2 and
CompAutograd (torch.compile), the experimental memory-stashing ones.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torchrec.distributed.train_pipeline import TrainPipeline

from dlrmtrain.comm.torchrec_hooks import PlanAheadStreamlessFusedSparseDist, PlanAheadTrainPipelineSparseDist


def build_train_pipeline(mode: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                         device: torch.device, forward: Callable) -> Optional[TrainPipeline]:
    """The pipeline for run.pipeline `mode` over the sharded `model` (its steps call
    `forward(batch)`, e.g. under autocast); None for `off`. It drains the batches in
    flight at the end of the data by itself."""
    if mode == "off":
        return None
    if mode == "sparse_dist":
        return PlanAheadTrainPipelineSparseDist(model, optimizer, device, custom_model_fwd=forward)
    if mode == "fused_sparse_dist":
        return PlanAheadStreamlessFusedSparseDist(model, optimizer, device, custom_model_fwd=forward)
    raise ValueError(f"run.pipeline: unknown mode {mode!r}")  # the loader checks the choices
