"""The user embedding's last step, after the STU layers (the reference's output
postprocessors). The Yambda config uses `timestamp_layer_norm`: the candidate's
hour of day and day of week as (cos, sin) pairs, a linear map back to D, a LayerNorm.
`layer_norm` and `l2_norm` are the reference's other two.

The time features are computed as the reference computes them, in fp32 from the
timestamp's fp32 value (so past 2^24 s the timestamp is first rounded: at 1.7e9 s to
a multiple of 128 s, which can move the hour), the angle as `phase * 2 * 3.14` and
(cos, sin) through `torch.polar`; float64 or `torch.cos` / `torch.sin` give other bits.
The final norms are plain `nn.LayerNorm`s as the reference's: under autocast they
return fp32, so the user embedding leaves the bf16 user tower unrounded.
"""

from __future__ import annotations

import torch
from torch import nn

from dlrmtrain.models.hstu.layers import init_xavier_uniform_zero_bias

TIME_PERIODS: list[tuple[int, int]] = [(60 * 60, 24), (24 * 60 * 60, 7)]
"""(seconds per unit, units per period): hour of day, day of week."""
REFERENCE_PI = 3.14
"""The reference's angle of a full period is `· 2 · 3.14` (two fp32 products, in that order)."""


class TimestampLayerNormPostprocessor(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.register_buffer("period_seconds", torch.tensor([p for p, _ in TIME_PERIODS],
                                                            dtype=torch.float32), persistent=False)
        self.register_buffer("units_per_period", torch.tensor([u for _, u in TIME_PERIODS],
                                                              dtype=torch.float32), persistent=False)
        self.combiner = nn.Linear(dim + 2 * len(TIME_PERIODS), dim)
        init_xavier_uniform_zero_bias(self.combiner)
        self.norm = nn.LayerNorm(dim, eps=eps)

    def time_features(self, timestamps: torch.Tensor) -> torch.Tensor:
        """[T] seconds → [T, 2·periods]: (cos, sin) of the phase in each period."""
        units = torch.div(timestamps.unsqueeze(-1).float(), self.period_seconds,
                          rounding_mode="floor")
        angle = torch.remainder(units, self.units_per_period) / self.units_per_period * 2 * REFERENCE_PI
        unit_circle = torch.polar(torch.ones_like(angle), angle)
        return torch.view_as_real(unit_circle).flatten(-2)

    def forward(self, x: torch.Tensor, timestamps: torch.Tensor) -> torch.Tensor:
        features = torch.cat([x, self.time_features(timestamps).to(x.dtype)], dim=-1)
        return self.norm(self.combiner(features))


class LayerNormPostprocessor(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor, timestamps: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


class L2NormPostprocessor(nn.Module):
    def forward(self, x: torch.Tensor, timestamps: torch.Tensor) -> torch.Tensor:
        return x / torch.linalg.norm(x, ord=2, dim=-1, keepdim=True).clamp(min=1e-6)


def build_postprocessor(kind: str, dim: int) -> nn.Module:
    if kind == "timestamp_layer_norm":
        return TimestampLayerNormPostprocessor(dim)
    if kind == "layer_norm":
        return LayerNormPostprocessor(dim)
    if kind == "l2_norm":
        return L2NormPostprocessor()
    raise ValueError(f"unknown postprocessor {kind!r}")


def postprocessor_params(kind: str, dim: int) -> int:
    if kind == "timestamp_layer_norm":
        return (dim + 2 * len(TIME_PERIODS) + 1) * dim + 2 * dim
    return 2 * dim if kind == "layer_norm" else 0
