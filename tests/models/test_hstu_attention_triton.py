"""The Triton attention kernels (attention/triton_kernels.py) against the padded reference,
forward and every gradient, run by Triton's interpreter on CPU tensors at tiny shapes
(tiles of 16, N ≤ 32; in a process of their own: triton_attention_runs.py).

Tolerance: attention/rounding.py's first-order bound, per element: 2·n·u·A in fp32
(u = 2⁻²⁴, n = N + max(dqk, dv) + 8, A the sum over the terms' magnitude bounds), plus
2·2⁻⁸·A for bf16 against padded in fp32 on the same bf16 values.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from dlrmtrain.models.hstu.attention import padded_silu_attention, rounding
from tests.models import triton_attention_runs as runs


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


def _check_run(results: dict, name: str) -> None:
    run = runs.RUNS[name]
    got = results[name]
    exact = tuple(x.float() if torch.is_tensor(x) and x.is_floating_point() else x for x in runs.inputs(run))
    want = runs.forward_backward(padded_silu_attention, *exact)
    q, k, v, do, offsets, lengths, num_targets, max_len = exact
    bounds = rounding.magnitudes(q, k, v, do, offsets, lengths, num_targets, max_len, runs.ALPHA)
    factor = rounding.tolerance(run.dtype, max_len, q.shape[2], v.shape[2])
    for part, g, w, a in zip(("out", "dq", "dk", "dv"), got, want, bounds):
        assert g.dtype == run.dtype and g.shape == w.shape, (part, g.dtype, g.shape, w.shape)
        error, allowed = (g.double() - w.double()).abs(), factor * a
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


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_the_bound_holds_for_padded_fp32_against_float64(scale):
    """rounding.py's bound for one kernel (half the two-kernel factor) holds for the padded
    kernel in fp32 against itself in float64, with scores large enough (scale 4) for SiLU to
    saturate and cancel."""
    for name in ("mixed", "padded_n"):
        q, k, v, do, *rest = runs.inputs(runs.RUNS[name])
        q, k = q * scale, k * scale
        got = runs.forward_backward(padded_silu_attention, q, k, v, do, *rest)
        exact = runs.forward_backward(padded_silu_attention, q.double(), k.double(), v.double(), do.double(), *rest)
        bounds = rounding.magnitudes(q, k, v, do, *rest, runs.ALPHA)
        ratios = rounding.worst_ratio(got, exact, bounds, rounding.tolerance(torch.float32, rest[-1], q.shape[2],
                                                                             v.shape[2]) / 2)
        assert max(ratios.values()) <= 1.0, (name, ratios)
