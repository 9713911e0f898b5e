"""The dense optimizer beside TorchRec's fused (in-backward) embedding optimizer.

Sharded tables are updated by fbgemm inside the backward pass (see
fused.py for their parameters: SGD, Adagrad, or RowWiseAdagrad
with `optim.name: adam`); everything else — MLPs and data-parallel tables —
goes to a torch optimizer: SGD, Adagrad, or Adam for `adam` (the MLPerf DLRMv4
reference's pairing). Both are combined so one `step()` / `zero_grad()` and
one schedule drive them; `optim.grad_clip_norm` clips the dense gradients
inside that `step()`, so the plain loop and TorchRec's pipeline both clip.
"""

from __future__ import annotations

from typing import Optional

import torch
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrmtrain.config.schema import OptimConfig


def _dense_optimizer_factory(cfg: OptimConfig):
    if cfg.name == "sgd":
        return lambda params: torch.optim.SGD(params, lr=cfg.lr)
    if cfg.name == "adam":
        return lambda params: _adam_with_state(params, cfg)
    return lambda params: torch.optim.Adagrad(params, lr=cfg.lr, eps=cfg.adagrad_eps)


def dense_state_per_parameter(cfg: OptimConfig) -> int:
    """fp32 values the dense optimizer keeps per parameter value (sgd none, adagrad its sum,
    adam its two moments), read off the optimizer `build_optimizer` makes: the memory
    check's count (optim/state_size.py)."""
    p = torch.nn.Parameter(torch.zeros(4))
    state = _dense_optimizer_factory(cfg)([p]).state.get(p, {})
    return sum(t.numel() for t in state.values() if torch.is_tensor(t) and t.shape == p.shape) // p.numel()


def _adam_with_state(params: list[torch.Tensor], cfg: OptimConfig) -> torch.optim.Adam:
    """torch's Adam with its state made now, as its first step would (step 0, zero
    moments), not lazily: a checkpoint loads into the state that exists (as Adagrad's
    does from its construction), so a run resumed before any step of its own restores
    the moments and the step count instead of silently starting them afresh."""
    beta1, beta2 = cfg.adam_betas
    adam = torch.optim.Adam(params, lr=cfg.lr, betas=(beta1, beta2), eps=cfg.adam_eps,
                            weight_decay=0.0)
    for p in params:
        adam.state[p] = {"step": torch.tensor(0.0, dtype=torch.float32),
                         "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                         "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
    return adam


class DenseClippedOptimizer(CombinedOptimizer):
    """A CombinedOptimizer whose `step()` first clips the dense gradients to a total
    L2 norm. They are already all-reduced (DDP), so every rank clips alike."""

    def __init__(self, optims: list[KeyedOptimizer], dense_params: list[torch.Tensor],
                 max_norm: float) -> None:
        super().__init__(optims)
        self._dense_params = dense_params
        self._max_norm = max_norm

    def step(self, closure=None) -> None:  # noqa: ANN001 - torch's signature
        torch.nn.utils.clip_grad_norm_(self._dense_params, self._max_norm)
        super().step(closure)


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> CombinedOptimizer:
    """`model` is the DistributedModelParallel module (it owns `fused_optimizer`)."""
    dense_params = dict(in_backward_optimizer_filter(model.named_parameters()))
    dense = KeyedOptimizerWrapper(dense_params, _dense_optimizer_factory(cfg))
    optims = [model.fused_optimizer, dense]
    max_norm: Optional[float] = cfg.grad_clip_norm
    if max_norm is None:
        return CombinedOptimizer(optims)
    return DenseClippedOptimizer(optims, list(dense_params.values()), max_norm)
