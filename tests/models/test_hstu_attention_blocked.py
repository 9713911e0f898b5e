"""The blocked attention (attention/blocked.py) against the padded reference, forward and every
gradient, and `model.hstu.attention`'s switch (attention/kinds.py, config/checks.py).

Tolerance: attention/rounding.py's first-order bound, per element: 2·n·u·A in fp32
(u = 2⁻²⁴, n = N + max(dqk, dv) + 8, A the sum over the terms' magnitude bounds), plus
2·2⁻⁸·A for bf16 against padded in fp32 on the same bf16 values. Small tiles and chunk
budgets make these tiny shapes cross many tiles and chunks (the defaults would run each
shape as one chunk).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from dlrmtrain.config import load_config
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.config.schema import HSTUAttention, choices
from dlrmtrain.models.hstu import build_hstu_model, jagged
from dlrmtrain.models.hstu.attention import attention_mask, blocked, kinds, padded_silu_attention, rounding
from dlrmtrain.models.hstu.attention.blocked import blocked_silu_attention
from dlrmtrain.validation import validate_config
from tests.models import triton_attention_runs as runs
from tests.models.hstu_batches import tiny_hstu_config

CPU = torch.device("cpu")
MINI = Path(__file__).resolve().parents[2] / "configs" / "mini_dlrmv4.yaml"

SHAPES = {
    **runs.SHAPES,  # a length-1 sample, an all-target one, one without targets; N past the longest
    # empty samples and N far past the longest: tiles of no row never exist
    "empty": ([0, 9, 33, 0, 2], [0, 1, 4, 0, 2], 48, 2, 8, 8),
    # one sample of targets only, longer than a tile: its tiles see only their own diagonal
    "targets": ([21, 3], [21, 1], 21, 1, 4, 4),
    # samples over several key tiles even at the default 128-row tiles, their targets spanning
    # two row tiles in both: pairs below the diagonal only where history is
    "key_tiles": ([140, 131], [20, 40], 160, 2, 8, 8),
}
TILINGS = [(4, 1), (8, 4096), (5, 2000), (blocked.ROWS_PER_TILE, blocked.CHUNK_BYTES)]
"""(rows_per_tile, chunk_bytes): a tile per chunk; several tiles per chunk; tiles that do not
divide the lengths; the defaults (one chunk here)."""


def _inputs(shape: str, dtype: torch.dtype, seed: int = 0) -> tuple:
    """(q, k, v, do, offsets, lengths, num_targets, max_len)."""
    lengths, num_targets, max_len, heads, dqk, dv = SHAPES[shape]
    lengths, num_targets = torch.tensor(lengths), torch.tensor(num_targets)
    gen = torch.Generator().manual_seed(seed)
    total = int(lengths.sum())
    q, k, v, do = (torch.randn(total, heads, d, generator=gen).to(dtype) for d in (dqk, dqk, dv, dv))
    return q, k, v, do, jagged.offsets_of(lengths), lengths, num_targets, max_len


def _assert_within_bound(shape: str, dtype: torch.dtype, rows_per_tile: int, chunk_bytes: int) -> None:
    inputs = _inputs(shape, dtype)
    fn = functools.partial(blocked_silu_attention, rows_per_tile=rows_per_tile, chunk_bytes=chunk_bytes)
    got = runs.forward_backward(fn, *inputs)
    exact = tuple(x.float() if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs)
    want = runs.forward_backward(padded_silu_attention, *exact)
    q, k, v, do, offsets, lengths, num_targets, max_len = exact
    bounds = rounding.magnitudes(q, k, v, do, offsets, lengths, num_targets, max_len, runs.ALPHA)
    factor = rounding.tolerance(dtype, max_len, q.shape[2], v.shape[2])
    for part, g, w, a in zip(("out", "dq", "dk", "dv"), got, want, bounds):
        assert g.dtype == dtype and g.shape == w.shape, (part, g.dtype, g.shape, w.shape)
        error, allowed = (g.double() - w.double()).abs(), factor * a
        worst = int((error - allowed).argmax()) if error.numel() else 0
        assert (error <= allowed).all(), (
            f"{shape} {part}: |blocked - padded| = {error.flatten()[worst]:.3e} > {allowed.flatten()[worst]:.3e} "
            f"at flat index {worst} (largest |error| {error.max():.3e}, largest |value| {w.abs().max():.3e})")


@pytest.mark.parametrize("rows_per_tile, chunk_bytes", TILINGS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fp32_forward_and_gradients_match_padded_within_the_summation_bound(shape, rows_per_tile, chunk_bytes):
    _assert_within_bound(shape, torch.float32, rows_per_tile, chunk_bytes)


@pytest.mark.parametrize("shape", ["mixed", "empty"])
def test_bf16_sums_in_fp32_and_matches_padded_in_fp32_within_bf16_rounding(shape):
    _assert_within_bound(shape, torch.bfloat16, 8, 4096)


def test_float64_matches_padded_to_its_own_rounding():
    """Any dtype: float64 inputs are summed in float64, far inside an fp32 bound."""
    inputs = _inputs("mixed", torch.float64)
    got = runs.forward_backward(functools.partial(blocked_silu_attention, rows_per_tile=4, chunk_bytes=1), *inputs)
    want = runs.forward_backward(padded_silu_attention, *inputs)
    for g, w in zip(got, want):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_it_keeps_no_score_sized_tensor_for_the_backward():
    """Every tensor saved for the backward is a per-token one or the tile table: none as large
    as one sample's [N, N] scores (one sample of N = 96 rows, 1 head, widths 4: per-token
    tensors hold 384 values, the scores 9,216)."""
    lengths, n = torch.tensor([96]), 96
    q, k, v = (torch.randn(n, 1, 4, requires_grad=True) for _ in range(3))
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = blocked_silu_attention(q, k, v, jagged.offsets_of(lengths), lengths, torch.tensor([1]), n, 0.5)
    assert saved and max(t.numel() for t in saved) < n * n / 8, [tuple(t.shape) for t in saved]
    out.sum().backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        padded_silu_attention(q, k, v, jagged.offsets_of(lengths), lengths, torch.tensor([1]), n, 0.5)
    assert max(t.numel() for t in saved) >= n * n  # what the check would catch: padded keeps [B, H, N, N]


def test_the_same_inputs_give_the_same_bits():
    """Each row's terms are summed in diagonal order, no index_add_ touching a row twice: every
    run gives the same bits (what `dedup` stays bitwise `none`'s forward under rests on)."""
    inputs = _inputs("mixed", torch.float32)
    fn = functools.partial(blocked_silu_attention, rows_per_tile=4, chunk_bytes=4096)
    first, second = runs.forward_backward(fn, *inputs), runs.forward_backward(fn, *inputs)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_tile_pairs_cover_each_allowed_row_key_pair_once_and_chunks_keep_to_the_budget():
    """Every (row, key) the mask allows lies in exactly one pair, no pair lacks one, a chunk's
    pairs share no row tile and no key tile (each index_add_ touches a row once) within budget,
    and a chunk run without the mask holds only whole tiles the mask hides nothing of."""
    lengths, num_targets, r, heads = torch.tensor([0, 9, 33, 1, 30]), torch.tensor([0, 1, 4, 1, 30]), 8, 2
    budget = heads * r * r * 4 * 3
    tiles, chunks = blocked.plan_tiles(jagged.offsets_of(lengths), num_targets, heads=heads, rows_per_tile=r,
                                       chunk_bytes=budget)
    mask = attention_mask(lengths, num_targets, int(lengths.max()))
    covered = torch.zeros(mask.shape, dtype=torch.int64)
    sample_of = {int(s): b for b, s in enumerate(jagged.offsets_of(lengths)[:-1].tolist()) if lengths[b] > 0}
    for start, length, history, row0, col0 in tiles.tolist():
        b = sample_of[start]
        assert length == lengths[b] and history == length - num_targets[b]
        rows, keys = slice(row0, min(row0 + r, length)), slice(col0, min(col0 + r, length))
        assert mask[b, rows, keys].any(), (b, row0, col0)
        covered[b, rows, keys] += 1
    valid = mask & (torch.arange(mask.shape[1]) < lengths[:, None])[:, :, None] \
        & (torch.arange(mask.shape[1]) < lengths[:, None])[:, None, :]
    assert (covered <= 1).all() and (covered[valid] == 1).all()  # no overlap; every allowed entry once
    # the all-target sample of 30 rows: its 4 diagonal pairs only
    assert sum(1 for t in tiles.tolist() if sample_of[t[0]] == 4) == 4
    assert [c.first for c in chunks] == [0] + [c.last for c in chunks[:-1]] and chunks[-1].last == len(tiles)
    for c in chunks:
        pairs = tiles[c.first:c.last].tolist()
        assert len({(p[0], p[3]) for p in pairs}) == len({(p[0], p[4]) for p in pairs}) == len(pairs)
        assert len({p[3] - p[4] for p in pairs}) == 1  # one diagonal offset
        for start, length, _, row0, col0 in pairs if not c.masked else ():  # run unmasked: nothing to hide
            assert row0 + r <= length and col0 + r <= length, (start, row0, col0)
            assert mask[sample_of[start], row0:row0 + r, col0:col0 + r].all(), (start, row0, col0)
        assert c.last - c.first == 1 or (c.last - c.first) * heads * c.rows * c.keys * 4 <= budget
    assert any(not c.masked for c in chunks) and any(c.masked for c in chunks)


# ---- model.hstu.attention: the switch, its resolution, its refusals ----

def test_kinds_map_every_schema_name_and_resolve_auto_by_device_and_length():
    assert choices(HSTUAttention) == ("auto", *kinds.KINDS)
    for kind in kinds.KINDS:
        assert kinds.resolve(kind, "cpu", 4096) == kinds.resolve(kind, "cuda", 64) == kind
    assert kinds.resolve("auto", "cuda", 64) == kinds.resolve("auto", "cuda", 4096) == "triton"
    assert kinds.resolve("auto", "cpu", kinds.CPU_PADDED_UP_TO_ROWS) == "padded"
    assert kinds.resolve("auto", "cpu", kinds.CPU_PADDED_UP_TO_ROWS + 1) == "blocked"
    assert kinds.kernel("blocked") is blocked_silu_attention and kinds.kernel("padded") is padded_silu_attention
    with pytest.raises(ValueError, match=r"model\.hstu\.attention: 'flash' is not one of auto, padded"):
        kinds.resolve("flash", "cpu", 64)
    with pytest.raises(ValueError, match="resolve `auto` first"):
        kinds.kernel("auto")


@pytest.mark.parametrize("attention, rows, kind", [
    ("auto", 64, "padded"), ("auto", 256, "blocked"), ("blocked", 64, "blocked"), ("padded", 256, "padded")])
def test_the_model_runs_the_kernel_its_config_names_resolved_once_at_build(attention, rows, kind):
    cfg = tiny_hstu_config(f"model.hstu.attention={attention}", f"model.hstu.max_seq_len={rows}")
    model = build_hstu_model(cfg, CPU, table_device=CPU)
    layers = list(model.stu.layers)
    assert [layer.attention_kind for layer in layers] == [kind] * len(layers)
    assert all(layer.attention is kinds.kernel(kind) for layer in layers)


def test_an_unknown_attention_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"model\.hstu\.attention: 'flash' is not one of auto, padded, "
                                          r"blocked, triton"):
        tiny_hstu_config("model.hstu.attention=flash")


def test_triton_is_refused_on_a_cpu_run_unless_triton_interprets(monkeypatch):
    cfg = load_config(MINI, ["model.hstu.attention=triton"])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match=r"model\.hstu\.attention: triton runs on CUDA, not on this cpu run .*"
                                          r"TRITON_INTERPRET=1"):
        validate_config(cfg, 2)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    validate_config(cfg, 2)
    monkeypatch.delenv("TRITON_INTERPRET")
    for kind in ("auto", "padded", "blocked"):
        validate_config(load_config(MINI, [f"model.hstu.attention={kind}"]), 2)
