"""The Triton attention kernels (attention/triton_kernels.py) against the padded reference,
forward and every gradient, run by Triton's interpreter on CPU tensors at tiny shapes
(tiles of 16, N ≤ 32; one process of their own: triton_attention_runs.py), and compiled for
an H100 without one.

Tolerance (fp32), per element, derived from the order of the sums: each kernel's rounding
error is at most n·u·A (first order; u = 2⁻²⁴, n = N + max(dqk, dv) + 8: up to N terms
over the keys, after dqk (or dv) terms in each score (or score gradient), plus a few
roundings per term), where A is the same sum taken over the terms' magnitude bounds:

    out_i:  Σ_j P⁺_ij |v_j|        P⁺ = m (|p| + 1.1 S⁺/N),  S⁺ = α |q_i|·|k_j|
    dv_j:   Σ_i P⁺_ij |do_i|
    dq_i:   α Σ_j D⁺_ij |k_j|      D⁺ = m (1.1 |do_i|·|v_j| + |dp_ij| (1.5 S⁺ + 6)) / N
    dk_j:   α Σ_i D⁺_ij |q_i|

(m the mask, p = SiLU(s)/N, dp = do·v; 1.1 bounds |SiLU'|, through which a score's error
reaches p; 1.5 S⁺ + 6 bounds how far SiLU'(s) moves with the score's error (|SiLU''| ≤ 0.5),
with its own cancellation in 1 − σ(s) (≤ |s|) and its few roundings). Two kernels differ by
at most twice that: 2·n·u·A. bf16, against padded in fp32 on the same bf16 values, adds the
rounding of each score tile to bf16 before its product and of the stored result: 2·2⁻⁸·A.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.nn import functional as F

from dlrmtrain.models.hstu import jagged
from dlrmtrain.models.hstu.attention import attention_mask, padded_silu_attention
from tests.models import triton_attention_runs as runs

U32, U16 = 2.0 ** -24, 2.0 ** -8


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict:
    """Every run's (out, dq, dk, dv) from the Triton kernels, made by Triton's interpreter in a
    process of its own (TRITON_INTERPRET=1 there only)."""
    path = tmp_path_factory.mktemp("triton") / "results.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, runs.__file__, str(path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return torch.load(path)


def _magnitudes(q, k, v, do, offsets, lengths, num_targets, max_len) -> tuple:
    """(A_out, A_dq, A_dk, A_dv) of the module docstring, in float64, jagged like the results."""
    total, heads = q.shape[:2]

    def padded(x):  # [L, H, d] → [B, H, N, d] float64
        return jagged.to_padded(x.double().reshape(total, -1), offsets, max_len) \
            .view(-1, max_len, heads, x.shape[2]).transpose(1, 2)

    def back(x):  # [B, H, N, d] → [L, H, d]
        return jagged.to_jagged(x.transpose(1, 2).reshape(-1, max_len, heads * x.shape[3]), offsets,
                                total).view(total, heads, -1)

    qp, kp, vp, dop = (padded(x) for x in (q, k, v, do))
    mask = attention_mask(lengths, num_targets, max_len).unsqueeze(1).double()
    s = runs.ALPHA * qp @ kp.transpose(2, 3)
    s_abs = runs.ALPHA * qp.abs() @ kp.abs().transpose(2, 3)
    p_bound = mask * (F.silu(s).abs() + 1.1 * s_abs) / max_len
    dp = dop @ vp.transpose(2, 3)
    d_bound = mask * (1.1 * dop.abs() @ vp.abs().transpose(2, 3) + dp.abs() * (1.5 * s_abs + 6)) / max_len
    return (back(p_bound @ vp.abs()), back(runs.ALPHA * d_bound @ kp.abs()),
            back(runs.ALPHA * d_bound.transpose(2, 3) @ qp.abs()), back(p_bound.transpose(2, 3) @ dop.abs()))


def _fp32_tolerance(shape: str) -> float:
    _, _, max_len, _, dqk, dv = runs.SHAPES[shape]
    return 2 * (max_len + max(dqk, dv) + 8) * U32


def _check_run(results: dict, name: str) -> None:
    run = runs.RUNS[name]
    got = results[name]
    exact = tuple(x.float() if torch.is_tensor(x) and x.is_floating_point() else x for x in runs.inputs(run))
    want = runs.forward_backward(padded_silu_attention, *exact)
    tolerance = _fp32_tolerance(run.shape) + (2 * U16 if run.dtype == torch.bfloat16 else 0.0)
    for part, g, w, a in zip(("out", "dq", "dk", "dv"), got, want, _magnitudes(*exact)):
        assert g.dtype == run.dtype and g.shape == w.shape, (part, g.dtype, g.shape, w.shape)
        error, allowed = (g.double() - w.double()).abs(), tolerance * a
        worst = int((error - allowed).argmax())
        assert (error <= allowed).all(), (
            f"{name} {part}: |triton - padded| = {error.flatten()[worst]:.3e} > {allowed.flatten()[worst]:.3e} "
            f"at flat index {worst} (largest |error| {error.max():.3e}, largest |value| {w.abs().max():.3e})")


@pytest.mark.parametrize("name", ["mixed", "padded_n", "unequal_tiles"])
def test_fp32_forward_and_gradients_match_padded_within_the_summation_bound(interpreted, name):
    _check_run(interpreted, name)


def test_bf16_matches_padded_in_fp32_within_bf16_rounding(interpreted):
    _check_run(interpreted, "bf16")


def test_refuses_what_it_cannot_run():
    """Without the interpreter, CPU tensors are refused by name (Triton would fail deep in its
    launcher); other dtypes and mismatched shapes too."""
    from dlrmtrain.models.hstu.attention import triton_kernels

    q, k, v, _, *rest = runs.inputs(runs.RUNS["mixed"])
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        triton_kernels.triton_silu_attention(q, k, v, *rest, runs.ALPHA)
    with pytest.raises(TypeError, match="fp32 or bf16"):
        triton_kernels.triton_silu_attention(q.double(), k.double(), v.double(), *rest, runs.ALPHA)
    with pytest.raises(ValueError, match="q, k"):
        triton_kernels.triton_silu_attention(q, k[:, :, :4], v, *rest, runs.ALPHA)
