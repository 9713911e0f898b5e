"""HSTU's causal, target-aware attention mask (the reference's `_get_valid_attn_mask`
with causal=True, no attention window, no contextual tokens).

Position i attends to position j when i == j or `id(i) > id(j)`, where
`id(p) = min(p, length - num_targets)`. So history rows see the rows before them, and
every target (candidate) row sees the whole history and itself but no other target.
"""

from __future__ import annotations

import torch


def attention_mask(lengths: torch.Tensor, num_targets: torch.Tensor, max_len: int) -> torch.Tensor:
    """[B, N, N] bool: may row i attend to column j."""
    ids = torch.arange(max_len, device=lengths.device).view(1, max_len)
    last_history_id = (lengths - num_targets).view(-1, 1)
    ids = torch.minimum(ids, last_history_id)                      # [B, N]
    row_minus_col = ids.unsqueeze(2) - ids.unsqueeze(1)            # [B, N, N]
    diagonal = torch.eye(max_len, dtype=torch.bool, device=lengths.device).unsqueeze(0)
    return diagonal | (row_minus_col > 0)
