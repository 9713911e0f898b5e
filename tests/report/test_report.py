"""`dlrmtrain report` on real small runs (2 Gloo ranks, codec none and dedup)."""

from __future__ import annotations

import json
import shutil

import pytest

from dlrmtrain.report import ReportError, load_run, main, write_report
from tests.common import tiny_overrides, train_on_rank
from tests.multiproc import run_ranks

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _train(rank: int, world_size: int, out_dir: str, overrides: list[str]) -> dict:
    return train_on_rank(rank, world_size, None, tiny_overrides(out_dir, *overrides))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    run_ranks(_none_then_dedup, 2, str(out), timeout=300)
    return out / "none", out / "dedup"


def _none_then_dedup(rank: int, world_size: int, out_dir: str) -> None:
    """Both runs in one spawned group: a spawn costs as much as one of these runs."""
    for codec, extra in (("none", []), ("dedup", ["logging.step_breakdown=true"])):
        _train(rank, world_size, out_dir, ["run.max_steps=12", "eval.evals_per_epoch=4",
                                           "eval.target_auc=0.99", f"comm.codec={codec}",
                                           f"run.name={codec}", *extra])


def test_report_writes_every_plot_and_a_summary(two_runs, tmp_path):
    assert main([str(d) for d in two_runs] + ["--out", str(tmp_path / "rep")]) == 0
    rep = tmp_path / "rep"
    for name in ("auc", "loss", "throughput", "comm_bytes", "step_time"):
        data = (rep / f"{name}.png").read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
    md = (rep / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| none |") or
            line.startswith("| dedup |")]
    assert len(rows) == 2
    dedup_row = rows[1].split("|")
    assert float(dedup_row[-2].strip().rstrip("x")) > 1.0   # dedup sent fewer bytes than stock
    assert "![auc](auc.png)" in md and "not reached" in md


def test_run_start_is_recovered_from_the_first_window(two_runs):
    run = load_run(two_runs[0])
    summary = json.loads((two_runs[0] / "summary.json").read_text())
    # The last eval happened after the run started and within the run's wall time.
    last = run.evals[-1]["time"] - run.start_time
    assert 0 < last <= summary["wall_seconds"] + 1.0


def test_plots_without_comm_stats_or_breakdown_are_skipped(two_runs, tmp_path):
    run = tmp_path / "no_comm_stats"  # e.g. a run from before every codec wrote comm_stats.json
    shutil.copytree(two_runs[0], run)
    (run / "comm_stats.json").unlink()
    written = write_report([run], tmp_path / "report")
    assert {p.name for p in written} == {"auc.png", "loss.png", "throughput.png", "report.md"}


def test_two_level_runs_are_told_apart_from_one_level_ones(two_runs, tmp_path):
    """A run with comm.hierarchy: node is `dedup/node` in the report (its own colour and legend
    entry), as the MLPerf runner's --codecs names it, not merged with one-level `dedup`."""
    import yaml

    from dlrmtrain.report import _colour

    run = tmp_path / "two_level"
    shutil.copytree(two_runs[1], run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["comm"]["hierarchy"] = "node"
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert load_run(two_runs[1]).codec == "dedup"
    assert load_run(run).codec == "dedup/node"
    assert _colour("dedup/node") != _colour("dedup")
    md = write_report([two_runs[1], run], tmp_path / "report")[-1].read_text()
    assert "| dedup/node |" in md and "| dedup |" in md


def test_a_damaged_metrics_line_is_named(two_runs, tmp_path):
    run = tmp_path / "damaged"
    shutil.copytree(two_runs[0], run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": \n')
    lines = len((run / "metrics.jsonl").read_text().splitlines())
    with pytest.raises(ReportError, match=rf"metrics.jsonl:{lines}: not valid JSON"):
        load_run(run)
    with pytest.raises(ReportError, match=r"no config.yaml \(not a finished dlrmtrain run"):
        load_run(tmp_path)
