"""Action embeddings: what the user did at each history event, as the reference's
`ActionEncoder` (no watch-time thresholds).

History row: for each action bit (listen_plus 1, like 2, skip 4) its own learned
vector where the bit is set, zeros where not, concatenated → [L_uih, bits · dim].
Candidate row: one learned vector (its action is what the model predicts, so it
must not be an input).
"""

from __future__ import annotations

import torch
from torch import nn

from dlrmtrain.models.hstu import jagged


class ActionEncoder(nn.Module):
    def __init__(self, action_bits: list[int], dim: int, init_std: float) -> None:
        super().__init__()
        self.register_buffer("action_bits", torch.tensor(action_bits), persistent=False)
        self.action_table = nn.Parameter(torch.empty(len(action_bits), dim).normal_(0.0, init_std))
        self.target_action = nn.Parameter(torch.empty(1, len(action_bits) * dim).normal_(0.0, init_std))

    @property
    def output_dim(self) -> int:
        return self.target_action.shape[1]

    def forward(self, history_actions: torch.Tensor, history_lengths: torch.Tensor,
                num_targets: torch.Tensor, total_targets: int) -> torch.Tensor:
        """history_actions: [L_uih] action bitmasks → [L_uih + total_targets, output_dim]
        jagged like the merged history + candidate sequence."""
        present = (history_actions.unsqueeze(-1) & self.action_bits.unsqueeze(0)) > 0
        history = (present.unsqueeze(-1) * self.action_table.unsqueeze(0)).flatten(1)
        targets = self.target_action.expand(total_targets, -1)
        return jagged.concat(history, history_lengths, targets, num_targets)


def action_encoder_params(num_bits: int, dim: int) -> int:
    return 2 * num_bits * dim
