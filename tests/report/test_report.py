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
                                           "eval.target_auc=0.99", f"comm.codec={codec}", "comm.dedup_at=owner",
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


TORN = b'{"kind": "train", "time": 17.5, "step": 13, "lo'


def test_a_torn_last_line_is_skipped_and_said(two_runs, tmp_path, capsys):
    """Issue 34, 4: a run killed mid-write leaves a last line without its newline; the
    report refused the run. It reads every record before it and says what it skipped."""
    run = tmp_path / "torn"
    shutil.copytree(two_runs[0], run)
    whole = load_run(run)
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(TORN)
    lines = len((run / "metrics.jsonl").read_text().splitlines())
    torn = load_run(run)
    assert (torn.train, torn.evals) == (whole.train, whole.evals)
    assert torn.skipped == [f"{run / 'metrics.jsonl'}:{lines}: skipped a torn last line "
                            f"({len(TORN)} bytes; the run stopped while writing it)"]
    assert main([str(run), "--out", str(tmp_path / "rep")]) == 0
    assert f"report: {torn.skipped[0]}" in capsys.readouterr().out
    assert torn.skipped[0] in (tmp_path / "rep" / "report.md").read_text()


def test_a_record_an_older_resume_glued_onto_a_torn_line_is_read(two_runs, tmp_path):
    """Runs resumed before the torn line was set aside hold it glued to the `resumed`
    record; that record and every later one are read, the torn start skipped."""
    run = tmp_path / "glued"
    shutil.copytree(two_runs[0], run)
    whole = load_run(run)
    later = [{"kind": "resumed", "time": 20.0, "step": 12, "checkpoint": None},
             {"kind": "train", "time": 21.0, "step": 13, "loss": 0.5, "lr": 0.05,
              "samples_per_s": 1000.0}]
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(TORN + "\n".join(json.dumps(r) for r in later).encode() + b"\n")
    (run / "metrics.jsonl.torn-1").write_bytes(TORN)  # one set aside by a later resume
    glued = load_run(run)
    assert glued.train == whole.train + later[1:]
    lines = len((run / "metrics.jsonl").read_text().splitlines())
    assert glued.skipped == [
        f"{run / 'metrics.jsonl'}:{lines - 1}: skipped its first {len(TORN)} bytes, a torn "
        f"line an older resume appended its record to",
        f"{run / 'metrics.jsonl.torn-1'}: {len(TORN)} bytes of a torn line, set aside when "
        f"the run resumed (not read)"]


def _as_arch(src, dst, arch: str):
    import yaml

    shutil.copytree(src, dst)
    cfg = yaml.safe_load((dst / "config.yaml").read_text())
    cfg["model"]["arch"] = arch
    (dst / "config.yaml").write_text(yaml.safe_dump(cfg))
    return dst


def test_runs_of_different_families_are_refused_on_one_chart_unless_mixed(two_runs, tmp_path,
                                                                          capsys):
    """Issue 34, 7: a DLRM and a DLRMv4 run were drawn on one chart, the latter "1.02x
    less" than the former's baseline. Refused (exit 2, one line, nothing written) unless
    --mixed, which draws each family's all-to-all chart apart."""
    v4 = _as_arch(two_runs[1], tmp_path / "v4", "dlrmv4_hstu")
    dcnv2 = _as_arch(two_runs[1], tmp_path / "dcnv2", "dlrm_dcnv2")
    out = tmp_path / "rep"
    assert main([str(two_runs[0]), str(v4), "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("report: runs of different model families")
    assert f"DLRM: {two_runs[0]} (dlrm_v1); DLRMv4: {v4} (dlrmv4_hstu)" in line
    assert "--mixed" in line and not out.exists()
    assert main([str(two_runs[0]), str(dcnv2), "--out", str(out)]) == 0  # one family: DLRM
    mixed = tmp_path / "mixed"
    assert main([str(two_runs[0]), str(v4), "--out", str(mixed), "--mixed"]) == 0
    assert {"comm_bytes_DLRM.png", "comm_bytes_DLRMv4.png"} <= {p.name for p in mixed.iterdir()}
    assert not (mixed / "comm_bytes.png").exists()
    assert "Model families drawn together (--mixed): DLRM: none; DLRMv4: dedup" in \
        (mixed / "report.md").read_text()


def test_report_families_are_the_workloads_families():
    """The report's family of each model.arch splits the archs as the workloads do (one
    Workload class per family), so a new family cannot be drawn with another silently."""
    from dlrmtrain.report import model_family
    from dlrmtrain.workloads.registry import WORKLOADS

    def split(key):
        groups: dict = {}
        for arch, workload in WORKLOADS.items():
            groups.setdefault(key(arch, workload), set()).add(arch)
        return sorted(sorted(g) for g in groups.values())

    assert split(lambda arch, w: type(w)) == split(lambda arch, w: model_family(arch))
