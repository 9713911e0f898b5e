"""scripts/compare_series.py matches two runner series seed by seed and fails when a seed
stopped at another evaluation; its loss gap is the relative one, at common steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script


def write_run(out: Path, seed: int, stop: int, losses: dict[int, float], aucs: dict[int, float]) -> None:
    run = out / "runs" / "cpu2_gloo_codec-none" / f"run{seed}_seed{seed}"
    run.mkdir(parents=True)
    evals = [{"step": s, "auc": a} for s, a in aucs.items()]
    (run / "summary.json").write_text(json.dumps({"steps": stop, "reached_target": aucs[stop] >= 0.685,
                                                  "final_auc": aucs[stop], "evals": evals}))
    records = [{"kind": "train", "step": s, "loss": v} for s, v in losses.items()]
    records.insert(1, {"kind": "eval", "step": 64, "auc": aucs[64]})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_same_stops_pass_and_the_loss_gap_is_relative(tmp_path, capsys):
    script = load_script("compare_series")
    a, b = tmp_path / "a", tmp_path / "b"
    for seed in (0, 1):
        write_run(a, seed, 128, {10: 0.5, 20: 0.4, 30: 0.2}, {64: 0.6, 128: 0.69})
        write_run(b, seed, 128, {10: 0.5, 20: 0.4, 30: 0.2002}, {64: 0.6001, 128: 0.69})
    assert script.main([str(a), str(b)]) == 0
    c = script.compare_seed(a / "runs/cpu2_gloo_codec-none/run0_seed0", b / "runs/cpu2_gloo_codec-none/run0_seed0")
    assert c["loss_steps"] == 3 and c["loss_rel_first"] == 0 and c["loss_rel_max"] == pytest.approx(1e-3)
    assert c["auc_gap_max"] == pytest.approx(1e-4)
    assert "same evaluation in both: yes" in capsys.readouterr().out


def test_a_seed_stopping_at_another_evaluation_fails(tmp_path, capsys):
    script = load_script("compare_series")
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(a, 0, 128, {10: 0.5}, {64: 0.6, 128: 0.69})
    write_run(b, 0, 192, {10: 0.5}, {64: 0.6, 128: 0.68, 192: 0.69})
    assert script.main([str(a), str(b)]) == 1
    assert "| run0_seed0 | 128 / 192 |" in capsys.readouterr().out
