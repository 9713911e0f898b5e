"""The STU layer (HSTU's transformer block) and a stack of them.

One layer, on jagged rows x [L, D] (the reference's `STULayer` with its PyTorch
kernels `hstu_compute_uqvk`, `pytorch_hstu_mha`, `pytorch_hstu_compute_output`):

    u, v, q, k = split(LayerNorm(x) @ W_uvqk + b_uvqk);  u = SiLU(u)
    a = SiLUAttention(q, k, v)                      (attention/: the kernel its kind names)
    y = Dropout(concat[u, a, u ⊙ LayerNorm(a)])
    x + y @ W_out

No feed-forward block: the gate u and the output projection take its place.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from dlrmtrain.models.hstu.attention import kinds
from dlrmtrain.models.hstu.layers import at_least_fp32

NORM_EPS = 1e-6
"""Both STU layer norms (the reference passes norm_eps=1e-6)."""


class STULayer(nn.Module):
    def __init__(self, dim: int, num_heads: int, qk_dim: int, linear_dim: int,
                 dropout: float, attention: str = "padded") -> None:
        """`attention`: a resolved kind (attention/kinds.py), its kernel looked up once here."""
        super().__init__()
        self.num_heads, self.qk_dim, self.linear_dim = num_heads, qk_dim, linear_dim
        self.attention_kind, self.attention = attention, kinds.kernel(attention)
        self.dropout = dropout
        self.alpha = 1.0 / qk_dim ** 0.5
        uvqk_width = (2 * linear_dim + 2 * qk_dim) * num_heads
        # [in, out] layouts and names as the reference (so its checkpoints map 1:1)
        self.uvqk_weight = nn.Parameter(nn.init.xavier_uniform_(torch.empty(dim, uvqk_width)))
        self.uvqk_bias = nn.Parameter(torch.zeros(uvqk_width))
        self.input_norm_weight = nn.Parameter(torch.ones(dim))
        self.input_norm_bias = nn.Parameter(torch.zeros(dim))
        self.output_weight = nn.Parameter(
            nn.init.xavier_uniform_(torch.empty(3 * linear_dim * num_heads, dim)))
        self.output_norm_weight = nn.Parameter(torch.ones(linear_dim * num_heads))
        self.output_norm_bias = nn.Parameter(torch.zeros(linear_dim * num_heads))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                num_targets: torch.Tensor, max_len: int) -> torch.Tensor:
        h, dqk, dv = self.num_heads, self.qk_dim, self.linear_dim
        x32 = at_least_fp32(x)
        normed = F.layer_norm(x32, (x.shape[-1],), self.input_norm_weight.to(x32.dtype),
                              self.input_norm_bias.to(x32.dtype), NORM_EPS).to(x.dtype)
        uvqk = torch.addmm(self.uvqk_bias.to(x.dtype), normed, self.uvqk_weight.to(x.dtype))
        u, v, q, k = torch.split(uvqk, [h * dv, h * dv, h * dqk, h * dqk], dim=1)
        u = F.silu(u)
        attn = self.attention(q.reshape(-1, h, dqk), k.reshape(-1, h, dqk), v.reshape(-1, h, dv),
                              offsets, lengths, num_targets, max_len, self.alpha)
        u32, attn32 = at_least_fp32(u), at_least_fp32(attn)
        gated = u32 * F.layer_norm(attn32, (attn32.shape[-1],),
                                   self.output_norm_weight.to(attn32.dtype),
                                   self.output_norm_bias.to(attn32.dtype), NORM_EPS)
        y = F.dropout(torch.cat([u32, attn32, gated], dim=1), p=self.dropout,
                      training=self.training).to(x.dtype)
        return torch.addmm(x, y, self.output_weight.to(x.dtype))


class STUStack(nn.Module):
    def __init__(self, layers: list[STULayer]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                num_targets: torch.Tensor, max_len: int) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, offsets, lengths, num_targets, max_len)
        return x


def stu_layer_params(dim: int, num_heads: int, qk_dim: int, linear_dim: int) -> int:
    """Parameters of one `STULayer`."""
    uvqk = (2 * linear_dim + 2 * qk_dim) * num_heads
    return (dim + 1) * uvqk + 2 * dim + 3 * linear_dim * num_heads * dim + 2 * linear_dim * num_heads
