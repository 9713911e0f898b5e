"""The dense optimizer choices: Adam with the reference's constants, and clipping of the
dense gradients inside `step()` (so the plain loop and the pipeline both clip)."""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.optim.keyed import KeyedOptimizerWrapper

from dlrmtrain.config import load_config
from dlrmtrain.optim.fused import fused_params
from dlrmtrain.optim.optimizers import DenseClippedOptimizer, _dense_optimizer_factory


def _params(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {"w": torch.nn.Parameter(torch.randn(4, 3)), "b": torch.nn.Parameter(torch.randn(3))}


def test_adam_with_clipping_equals_torch_adam_on_clipped_gradients():
    cfg = load_config(None, ["optim.name=adam", "optim.lr=0.01", "optim.adam_betas=[0.95, 0.999]",
                             "optim.grad_clip_norm=1.0"]).optim
    ours, ref = _params(), _params()
    grads = {"w": torch.full((4, 3), 2.0), "b": torch.full((3,), -3.0)}  # norm ~7.5: clipped
    for p in (ours, ref):
        for k, g in grads.items():
            p[k].grad = g.clone()
    opt = DenseClippedOptimizer([KeyedOptimizerWrapper(ours, _dense_optimizer_factory(cfg))],
                                list(ours.values()), cfg.grad_clip_norm)
    # the moments exist before the first step (a checkpoint loads into them), at zero
    assert all(torch.equal(opt.state[ours[k]]["exp_avg_sq"], torch.zeros_like(ours[k])) for k in ours)
    opt.step()  # and still equals torch's lazily initialised Adam
    torch.nn.utils.clip_grad_norm_(list(ref.values()), 1.0)
    torch.optim.Adam(list(ref.values()), lr=0.01, betas=(0.95, 0.999), eps=1e-8).step()
    for k in ours:
        torch.testing.assert_close(ours[k], ref[k], rtol=0, atol=0)
    assert abs(torch.cat([ours[k].grad.flatten() for k in ours]).norm().item() - 1.0) < 1e-6
    group = opt.param_groups[0]
    assert group["betas"] == (0.95, 0.999) and group["eps"] == 1e-8 and group["weight_decay"] == 0.0


def test_adam_puts_rowwise_adagrad_on_the_tables():
    cfg = load_config(None, ["optim.name=adam", "optim.adagrad_eps=1e-8"])
    params = fused_params(cfg.optim, "fp32", "cpu")
    assert params["optimizer"] == EmbOptimType.EXACT_ROWWISE_ADAGRAD and params["eps"] == 1e-8
