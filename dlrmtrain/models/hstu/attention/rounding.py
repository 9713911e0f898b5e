"""How far two correct kernels of HSTU's attention may differ: a first-order rounding-error
bound per element of the output and of each gradient, for tests and device checks that
compare a kernel against the padded reference.

Each kernel's error is at most n·u·A (u = 2⁻²⁴, n = N + max(dqk, dv) + 8: up to N terms
over the keys, after dqk (or dv) terms in each score (or score gradient), plus a few
roundings per term), whatever order it sums in, where A is the same sum taken over the
terms' magnitude bounds:

    out_i:  Σ_j P⁺_ij |v_j|        P⁺ = m (|p| + 1.1 S⁺/N),  S⁺ = α |q_i|·|k_j|
    dv_j:   Σ_i P⁺_ij |do_i|
    dq_i:   α Σ_j D⁺_ij |k_j|      D⁺ = m (1.1 |do_i|·|v_j| + |dp_ij| (1.5 S⁺ + 6)) / N
    dk_j:   α Σ_i D⁺_ij |q_i|

m is the mask, p = SiLU(s)/N, dp = do·v. 1.1 bounds |SiLU'|, through which a score's
error reaches p; 1.5 S⁺ + 6 bounds how far SiLU'(s) moves with the score's error
(|SiLU''| ≤ 0.5), its own cancellation in 1 − σ(s) (≤ |s|) and its few roundings. Two
kernels differ by at most twice one's error: 2·n·u·A. A bf16 kernel, against the padded
one in fp32 on the same bf16 values, adds the rounding of each score tile to bf16 before
its product and of the stored result: 2·2⁻⁸·A.

A is computed padded, in float64 ([B, H, N, N]): for small check cases only.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from dlrmtrain.models.hstu import jagged
from dlrmtrain.models.hstu.attention.mask import attention_mask

U_FP32 = 2.0 ** -24
U_BF16 = 2.0 ** -8


def tolerance(dtype: torch.dtype, max_len: int, dim_qk: int, dim_v: int) -> float:
    """The factor of A two kernels may differ by (the module docstring), for a kernel in
    `dtype` (fp32 or bf16) against the padded one in fp32."""
    fp32 = 2 * (max_len + max(dim_qk, dim_v) + 8) * U_FP32
    return fp32 + (2 * U_BF16 if dtype == torch.bfloat16 else 0.0)


def magnitudes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
               offsets: torch.Tensor, lengths: torch.Tensor, num_targets: torch.Tensor, max_len: int,
               alpha: float) -> tuple[torch.Tensor, ...]:
    """(A_out, A_dq, A_dk, A_dv) in float64, jagged like q, k, v: [L, H, d] each (grad_out
    [L, H, dv] or [L, H·dv])."""
    total, heads = q.shape[:2]
    grad_out = grad_out.reshape(v.shape)

    def padded(x: torch.Tensor) -> torch.Tensor:  # [L, H, d] → [B, H, N, d]
        return jagged.to_padded(x.double().reshape(total, -1), offsets, max_len) \
            .view(-1, max_len, heads, x.shape[2]).transpose(1, 2)

    def back(x: torch.Tensor) -> torch.Tensor:  # [B, H, N, d] → [L, H, d]
        return jagged.to_jagged(x.transpose(1, 2).reshape(-1, max_len, heads * x.shape[3]), offsets,
                                total).view(total, heads, -1)

    qp, kp, vp, dop = (padded(x) for x in (q, k, v, grad_out))
    mask = attention_mask(lengths, num_targets, max_len).unsqueeze(1).double()
    s_abs = alpha * qp.abs() @ kp.abs().transpose(2, 3)
    p_bound = mask * (F.silu(alpha * qp @ kp.transpose(2, 3)).abs() + 1.1 * s_abs) / max_len
    dp = dop @ vp.transpose(2, 3)
    d_bound = mask * (1.1 * dop.abs() @ vp.abs().transpose(2, 3) + dp.abs() * (1.5 * s_abs + 6)) / max_len
    return (back(p_bound @ vp.abs()), back(alpha * d_bound @ kp.abs()),
            back(alpha * d_bound.transpose(2, 3) @ qp.abs()), back(p_bound.transpose(2, 3) @ dop.abs()))


def worst_ratio(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...], bounds: tuple[torch.Tensor, ...],
                factor: float) -> dict[str, float]:
    """Per part (out, dq, dk, dv): max |got − want| / (factor · A); ≤ 1 where the bound holds
    (inf where A is 0 and they differ)."""
    ratios = {}
    for part, g, w, a in zip(("out", "dq", "dk", "dv"), got, want, bounds):
        error = (g.double().reshape(a.shape) - w.double().reshape(a.shape)).abs()
        allowed = factor * a
        ratio = torch.where(error == 0, torch.zeros_like(error), error / allowed)
        ratios[part] = float(ratio.max()) if ratio.numel() else 0.0
    return ratios
