"""HSTU's pointwise attention: SiLU(q·k · alpha) / N instead of a softmax, under the
causal, target-aware mask.

Mask (the reference's `_get_valid_attn_mask` with causal=True, no attention window,
no contextual tokens): position i attends to position j when i == j or
`id(i) > id(j)`, where `id(p) = min(p, length - num_targets)`. So history rows see
the rows before them, and every target (candidate) row sees the whole history and
itself but no other target. N is the longest sequence in the batch (the padded
length), as in the reference.

Computed padded ([B, H, N, N] scores), as the reference's PyTorch kernel does; fine
for the sequence lengths a CPU or a scaled run uses.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from dlrmtrain.models.hstu import jagged


def attention_mask(lengths: torch.Tensor, num_targets: torch.Tensor, max_len: int) -> torch.Tensor:
    """[B, N, N] bool: may row i attend to column j."""
    ids = torch.arange(max_len, device=lengths.device).view(1, max_len)
    last_history_id = (lengths - num_targets).view(-1, 1)
    ids = torch.minimum(ids, last_history_id)                      # [B, N]
    row_minus_col = ids.unsqueeze(2) - ids.unsqueeze(1)            # [B, N, N]
    diagonal = torch.eye(max_len, dtype=torch.bool, device=lengths.device).unsqueeze(0)
    return diagonal | (row_minus_col > 0)


def silu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                   lengths: torch.Tensor, num_targets: torch.Tensor, max_len: int,
                   alpha: float) -> torch.Tensor:
    """q, k: [L, H, dqk]; v: [L, H, dv] jagged → [L, H·dv] jagged."""
    total, heads, _ = q.shape
    dv = v.shape[2]

    def padded(x: torch.Tensor) -> torch.Tensor:  # [L, H, d] → [B, H, N, d]
        return jagged.to_padded(x.reshape(total, -1), offsets, max_len) \
            .view(-1, max_len, heads, x.shape[2]).transpose(1, 2)

    qp, kp, vp = padded(q), padded(k), padded(v)
    scores = F.silu(torch.matmul(qp, kp.transpose(2, 3)) * alpha) / max_len
    scores = scores * attention_mask(lengths, num_targets, max_len).unsqueeze(1).to(scores.dtype)
    out = torch.matmul(scores, vp)                                  # [B, H, N, dv]
    return jagged.to_jagged(out.transpose(1, 2).reshape(-1, max_len, heads * dv), offsets, total)
