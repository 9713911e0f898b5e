"""HSTU attention and the STU layer against direct, per-position computations."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from dlrmtrain.models.hstu import jagged
from dlrmtrain.models.hstu.attention import attention_mask, padded_silu_attention
from dlrmtrain.models.hstu.stu import STULayer


def _may_attend(i: int, j: int, length: int, num_targets: int) -> bool:
    """The rule, stated directly: history rows see themselves and earlier rows; a
    target row sees all history rows and itself, no other target."""
    history = length - num_targets
    if i >= length or j >= length:
        return False
    if i < history:
        return j <= i
    return j < history or j == i


def _direct_attention(q, k, v, lengths, num_targets, max_len, alpha):
    """Loops over samples, rows and columns: sum_j [may attend] silu(q_i·k_j·alpha)/N · v_j."""
    out, start = [], 0
    for n, t in zip(lengths.tolist(), num_targets.tolist()):
        for i in range(n):
            acc = torch.zeros(q.shape[1], v.shape[2], dtype=q.dtype)
            for j in range(n):
                if _may_attend(i, j, n, t):
                    s = F.silu((q[start + i] * k[start + j]).sum(-1) * alpha) / max_len
                    acc += s.unsqueeze(-1) * v[start + j]
            out.append(acc.reshape(-1))
        start += n
    return torch.stack(out)


def test_mask_is_causal_and_target_aware_within_each_length():
    lengths, num_targets, n = torch.tensor([6, 3, 5]), torch.tensor([2, 1, 1]), 7
    mask = attention_mask(lengths, num_targets, n)
    for b in range(3):
        for i in range(lengths[b]):
            for j in range(lengths[b]):
                assert bool(mask[b, i, j]) == _may_attend(i, j, int(lengths[b]), int(num_targets[b])), (b, i, j)
        # padding columns are never attended by a real row
        assert not mask[b, :lengths[b], lengths[b]:].any()


def test_silu_attention_equals_direct_masked_computation():
    gen = torch.Generator().manual_seed(0)
    lengths, num_targets = torch.tensor([5, 1, 7, 3]), torch.tensor([1, 1, 2, 1])
    total, heads, dqk, dv = int(lengths.sum()), 2, 3, 4
    q, k = (torch.randn(total, heads, dqk, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(total, heads, dv, generator=gen, dtype=torch.float64)
    max_len, alpha = int(lengths.max()), 0.7
    got = padded_silu_attention(q, k, v, jagged.offsets_of(lengths), lengths, num_targets, max_len, alpha)
    want = _direct_attention(q, k, v, lengths, num_targets, max_len, alpha)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_stu_layer_equals_its_formula():
    """x + Dropout-free concat[u, a, u ⊙ LN(a)] @ W_out, with u, v, q, k from LN(x) @ W + b."""
    torch.manual_seed(0)
    layer = STULayer(dim=6, num_heads=2, qk_dim=3, linear_dim=2, dropout=0.0).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    lengths, num_targets = torch.tensor([4, 2]), torch.tensor([1, 1])
    x = torch.randn(6, 6, dtype=torch.float64)
    got = layer(x, jagged.offsets_of(lengths), lengths, num_targets, 4)
    normed = F.layer_norm(x, (6,), layer.input_norm_weight, layer.input_norm_bias, 1e-6)
    u, v, q, k = (normed @ layer.uvqk_weight + layer.uvqk_bias).split([4, 4, 6, 6], dim=1)
    u = F.silu(u)
    a = _direct_attention(q.view(-1, 2, 3), k.view(-1, 2, 3), v.view(-1, 2, 2), lengths,
                          num_targets, 4, 1 / 3 ** 0.5)
    gated = u * F.layer_norm(a, (4,), layer.output_norm_weight, layer.output_norm_bias, 1e-6)
    want = x + torch.cat([u, a, gated], dim=1) @ layer.output_weight
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
