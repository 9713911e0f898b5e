"""The small building blocks the reference repeats: SwishLayerNorm and its
Linear → SwishLayerNorm → Linear → LayerNorm MLP.

Layer norms compute in fp32 whatever the input dtype (as the reference's
pytorch kernels do), so bf16 autocast does not lose their statistics.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 → fp32; fp32 and fp64 unchanged."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


class SwishLayerNorm(nn.Module):
    """x · sigmoid(LayerNorm(x)): the reference's gated normalisation."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = at_least_fp32(x)
        normed = F.layer_norm(x32, (x32.shape[-1],), self.weight.to(x32.dtype),
                              self.bias.to(x32.dtype), self.eps)
        return (x32 * torch.sigmoid(normed)).to(x.dtype)


class LayerNorm32(nn.LayerNorm):
    """nn.LayerNorm computed in fp32 and returned in the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = at_least_fp32(x)
        return F.layer_norm(x32, self.normalized_shape, self.weight.to(x32.dtype),
                            self.bias.to(x32.dtype), self.eps).to(x.dtype)


def init_xavier_uniform_zero_bias(module: nn.Module) -> None:
    """The reference's `init_mlp_weights_optional_bias`, applied to every Linear."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def swish_mlp(in_dim: int, hidden_dim: int, out_dim: int) -> nn.Sequential:
    """Linear → SwishLayerNorm → Linear → LayerNorm, Xavier-uniform weights, zero biases."""
    mlp = nn.Sequential(nn.Linear(in_dim, hidden_dim), SwishLayerNorm(hidden_dim),
                        nn.Linear(hidden_dim, out_dim), LayerNorm32(out_dim))
    return mlp.apply(init_xavier_uniform_zero_bias)


def swish_mlp_params(in_dim: int, hidden_dim: int, out_dim: int) -> int:
    """Parameters of `swish_mlp(in_dim, hidden_dim, out_dim)`."""
    return (in_dim + 1) * hidden_dim + 2 * hidden_dim + (hidden_dim + 1) * out_dim + 2 * out_dim
