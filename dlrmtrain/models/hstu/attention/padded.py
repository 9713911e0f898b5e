"""HSTU's pointwise attention computed padded: SiLU(q·k · alpha) / N instead of a
softmax, under the causal, target-aware mask (mask.py), with N the longest sequence in
the batch (the padded length), as in the reference.

Builds [B, H, N, N] scores, as the reference's PyTorch kernel does, and autograd keeps
them for the backward: memory and time grow with B·N², whatever the fill. The parity
reference for the other kernels.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from dlrmtrain.models.hstu import jagged
from dlrmtrain.models.hstu.attention.mask import attention_mask


def padded_silu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
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
