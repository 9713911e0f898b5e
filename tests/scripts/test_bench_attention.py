"""The attention benchmark (scripts/bench_attention.py) runs its smallest mode, measures memory
that a kernel really holds, takes the model's kernel names; bench_train's dlrmv4_long shape
is a valid config of long, unevenly filled sequences."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dlrmtrain.config import load_config
from dlrmtrain.data.yambda.builder import cross_specs, synthetic_profile
from dlrmtrain.data.yambda.synthetic import YambdaLikeGenerator
from dlrmtrain.validation import resolve_config, validate_config
from tests.scripts import REPO, load_script


def test_smallest_mode_prints_every_kernel_and_padded_memory_grows_with_its_scores(tmp_path):
    """One sample of 16 and of 512 rows, each kernel in its own process: padded's peak at 512
    rows holds at least one [1, 4, 512, 512] fp32 score tensor, at 16 rows far less (so the
    peak is the case's, not the process's start-up); blocked's is below padded's."""
    out_json = tmp_path / "cells.json"
    out = subprocess.run([sys.executable, "scripts/bench_attention.py", "--sizes", "16,512", "--cases", "full",
                          "--rounds", "1", "--iters", "0", "--device", "cpu", "--json", str(out_json)],
                         cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    cells = {(c["max_len"], c["kernel"]): c for c in json.loads(out_json.read_text())}
    kernels = sorted({k for _, k in cells})
    assert kernels == ["blocked", "padded"] and {n for n, _ in cells} == {16, 512}
    scores_bytes = 4 * 512 * 512 * 4
    assert cells[512, "padded"]["peak_mb"] * 1e6 >= scores_bytes, cells[512, "padded"]
    assert cells[16, "padded"]["peak_mb"] * 1e6 < scores_bytes / 4, cells[16, "padded"]
    # blocked keeps no score matrix: less than padded's whole step
    assert cells[512, "blocked"]["peak_mb"] < cells[512, "padded"]["peak_mb"], cells
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 1 × ")]
    assert len(rows) == 2 and all(row.count("|") == 3 + 2 * len(kernels) + 2 * (len(kernels) - 1)
                                  for row in rows), out.stdout


def test_kernels_are_the_models_kinds_and_an_unknown_one_is_named():
    script = load_script("bench_attention")
    with pytest.raises(script.UnknownKernel, match=r"unknown attention kernel 'nope' \(known: padded, blocked, triton\)"):
        script.kernel_named("nope")
    assert script.kernel_named("padded").__name__ == "padded_silu_attention"
    assert script.kernel_named("blocked").__name__ == "blocked_silu_attention"
    args = script.parse_args(["--kernels", "triton"])
    with pytest.raises(script.UnknownKernel, match="--allow-interpreter"):
        script.chosen_kernels(args, "cpu")
    assert script.chosen_kernels(script.parse_args([]), "cpu") == ["padded", "blocked"]


def test_cases_fix_what_they_say():
    script = load_script("bench_attention")
    cases = script.make_cases([512, 1024, 4096], fixed_tokens=2048)
    two = [c for c in cases if c.kind == "two"]
    assert [c.lengths for c in two] == [(512, 154), (1024, 307), (4096, 1229)]
    fixed = [c for c in cases if c.kind == "fixed"]
    assert [c.max_len for c in fixed] == [512, 1024] and {c.tokens for c in fixed} == {2048}
    assert all(max(c.lengths) == c.max_len for c in cases)


def test_dlrmv4_long_is_a_valid_config_of_long_uneven_sequences():
    script = load_script("bench_train")
    config, overrides = script.SHAPES["dlrmv4_long"]
    cfg = resolve_config(load_config(REPO / config, overrides))
    validate_config(cfg, world_size=2)
    assert cfg.model.arch == "dlrmv4_hstu" and cfg.model.hstu.max_seq_len == 2048
    assert cfg.run.global_batch_size // 2 >= 2                     # a local batch to pad
    gen = YambdaLikeGenerator(synthetic_profile(cfg.data), cross_specs(cfg.data))
    rows = gen.columns(np.arange(16)).history_lengths + 9          # 8 contextual + 1 candidate
    assert rows.max() <= 2048 and rows.min() >= 1024, rows
    assert len(set(rows.tolist())) >= 12, rows                      # every sample its own fill
