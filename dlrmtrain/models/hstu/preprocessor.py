"""The contextual preprocessor: table embeddings → the sequence the STU layers read
(the reference's `ContextualPreprocessor`).

Per history/candidate row (width E of the tables → D of the transducer):

    content_mlp(item) + additional_mlp([artist, album]) + action_mlp(actions)

and in front of every sample's sequence its contextual tokens (`uid` and the hashed
crosses), each through its own linear map E → D. Contextual tokens get timestamp 0.
The reference's `contextual_feature_to_min_uih_length` is 0 for Yambda (no token is
masked), so it is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from dlrmtrain.models.hstu import jagged
from dlrmtrain.models.hstu.action_encoder import ActionEncoder, action_encoder_params
from dlrmtrain.models.hstu.layers import swish_mlp, swish_mlp_params


@dataclass(frozen=True)
class PreprocessorSpec:
    """The contextual preprocessor's shape."""

    table_dim: int
    """E: the tables' embedding width."""
    hidden_dim: int
    """The hidden width of its MLPs."""
    dim: int
    """D: the transducer's width."""
    num_contextual: int
    """Contextual tokens in front of every sequence (uid and the crosses)."""
    num_additional: int
    """Additional tables per row (artist, album), concatenated into the additional MLP."""
    action_bits: Sequence[int]
    """The action encoder's bits (see ActionEncoder)."""
    action_dim: int
    action_init_std: float


class ContextualPreprocessor(nn.Module):
    def __init__(self, spec: PreprocessorSpec) -> None:
        super().__init__()
        table_dim, hidden_dim, dim = spec.table_dim, spec.hidden_dim, spec.dim
        num_contextual, num_additional = spec.num_contextual, spec.num_additional
        self.num_contextual, self.dim = num_contextual, dim
        std = math.sqrt(2.0 / (table_dim + dim))
        self.contextual_weight = nn.Parameter(
            torch.empty(num_contextual, table_dim, dim).normal_(0.0, std))
        self.contextual_bias = nn.Parameter(torch.zeros(num_contextual, dim))
        self.content_mlp = swish_mlp(table_dim, hidden_dim, dim)
        self.additional_mlp = swish_mlp(table_dim * num_additional, hidden_dim, dim)
        self.action_encoder = ActionEncoder(list(spec.action_bits), spec.action_dim, spec.action_init_std)
        self.action_mlp = swish_mlp(self.action_encoder.output_dim, hidden_dim, dim)

    def forward(self, items: torch.Tensor, additional: torch.Tensor, history_actions: torch.Tensor,
                contextual: torch.Tensor, seq_lengths: torch.Tensor, num_targets: torch.Tensor,
                timestamps: torch.Tensor, total_targets: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """items [L, E] and additional [L, A·E]: history + candidate rows, jagged by
        `seq_lengths`; history_actions [L_uih]; contextual [B, C, E]; timestamps [L].
        Returns (rows [L + B·C, D], lengths + C, timestamps), contextual tokens first."""
        actions = self.action_encoder(history_actions, seq_lengths - num_targets,
                                      num_targets, total_targets)
        rows = self.content_mlp(items) + self.additional_mlp(additional) + self.action_mlp(actions)
        batch = seq_lengths.shape[0]
        ctx = torch.baddbmm(self.contextual_bias.unsqueeze(1).to(contextual.dtype),
                            contextual.transpose(0, 1), self.contextual_weight.to(contextual.dtype))
        ctx = ctx.transpose(0, 1).reshape(batch * self.num_contextual, self.dim)
        ctx_lengths = torch.full_like(seq_lengths, self.num_contextual)
        rows = jagged.concat(ctx.to(rows.dtype), ctx_lengths, rows, seq_lengths)
        timestamps = jagged.concat(timestamps.new_zeros(batch * self.num_contextual), ctx_lengths,
                                   timestamps, seq_lengths)
        return rows, seq_lengths + self.num_contextual, timestamps


def preprocessor_params(table_dim: int, hidden_dim: int, dim: int, num_contextual: int,
                        num_additional: int, num_action_bits: int, action_dim: int) -> int:
    return (num_contextual * (table_dim + 1) * dim
            + swish_mlp_params(table_dim, hidden_dim, dim)
            + swish_mlp_params(table_dim * num_additional, hidden_dim, dim)
            + action_encoder_params(num_action_bits, action_dim)
            + swish_mlp_params(num_action_bits * action_dim, hidden_dim, dim))
