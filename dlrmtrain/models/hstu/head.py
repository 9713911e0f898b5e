"""Scoring a candidate: its item embedding meets the user embedding.

item:  [item, artist, album] table rows → item MLP → D        (reference `_item_forward`)
logit: Linear → SwishLayerNorm → Linear on user ⊙ item        (reference multitask module)
loss:  BCE(logit, listen_plus) averaged over candidates, × the task's loss weight
       (the reference's `causal_multitask_weights`, 0.2).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from dlrmtrain.models.hstu.layers import (
    SwishLayerNorm, init_xavier_uniform_zero_bias, swish_mlp, swish_mlp_params)


def item_mlp(table_dim: int, num_item_features: int, hidden_dim: int, dim: int) -> nn.Sequential:
    return swish_mlp(table_dim * num_item_features, hidden_dim, dim)


class PredictionHead(nn.Module):
    """user ⊙ item → one logit per candidate (one task: listen_plus)."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, hidden_dim), SwishLayerNorm(hidden_dim),
                                 nn.Linear(hidden_dim, 1)).apply(init_xavier_uniform_zero_bias)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        return self.mlp(user * item).squeeze(-1)


def weighted_bce(logits: torch.Tensor, labels: torch.Tensor, loss_weight: float) -> torch.Tensor:
    """Mean BCE in fp32 × loss_weight (the reference divides by max(#candidates, 1))."""
    per_candidate = F.binary_cross_entropy_with_logits(logits.float(), labels, reduction="none")
    return per_candidate.sum() / max(labels.numel(), 1) * loss_weight


def item_mlp_params(table_dim: int, num_item_features: int, hidden_dim: int, dim: int) -> int:
    return swish_mlp_params(table_dim * num_item_features, hidden_dim, dim)


def head_params(dim: int, hidden_dim: int) -> int:
    return (dim + 1) * hidden_dim + 2 * hidden_dim + hidden_dim + 1
