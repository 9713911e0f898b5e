"""The dense optimizer beside TorchRec's fused (in-backward) embedding optimizer.

Sharded tables are updated by fbgemm inside the backward pass (see
distributed/sharding.py for their parameters); everything else — MLPs and
data-parallel tables — goes to a torch optimizer of the same kind. Both are
combined so one `step()` / `zero_grad()` and one schedule drive them.
"""

from __future__ import annotations

import torch
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrmtrain.config.schema import OptimConfig


def _dense_optimizer_factory(cfg: OptimConfig):
    if cfg.name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=cfg.lr)
    return lambda params: torch.optim.Adagrad(params, lr=cfg.lr, eps=cfg.adagrad_eps)


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> CombinedOptimizer:
    """`model` is the DistributedModelParallel module (it owns `fused_optimizer`)."""
    dense_params = dict(in_backward_optimizer_filter(model.named_parameters()))
    dense = KeyedOptimizerWrapper(dense_params, _dense_optimizer_factory(cfg))
    return CombinedOptimizer([model.fused_optimizer, dense])
