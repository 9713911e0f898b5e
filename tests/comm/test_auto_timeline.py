"""`auto`'s choices read back in one line per run (comm/auto/timeline.py), from the lines its
policy makes (no ranks, no clock), as the MLPerf runner's summary and `dlrmtrain report` print
them."""

from __future__ import annotations

import json
from pathlib import Path

from dlrmtrain.comm.auto.policy import AutoPolicy
from dlrmtrain.comm.auto.timeline import dedup_share, events_of, run_line
from tests.comm.test_auto_policy import LINK


def decision_lines(times_at, steps: int, prefix: str = "source ") -> list[str]:
    """The lines `SourceAuto` lists (decisions, new probes) for step times `times_at(step, path)`."""
    p, lines = AutoPolicy(warmup_steps=1, probe_steps=6, check_every=50, min_dwell=200), []
    for step in range(steps):
        if p.needs_decision() or (p.early_check_due() and p.clear_cut(p.local_extremes())):
            none_s, dedup_s, *spreads = p.local_probe()
            d = p.decide(none_s, dedup_s, None, max(spreads), LINK)
            lines.append(f"{prefix}{d.head()} ({d.reason})")
        elif p.retime_due():
            p.reprobe()
            lines.append(prefix + p.retime_line())
        p.observe(times_at(step, p.path()))
    return lines


def close_then_clear(step: int, path: str) -> float:
    """A noisy first probe (dedup 1% faster), then dedup's real 25% gap."""
    if step < 13:
        return {"none": 0.0800, "dedup": 0.0792}[path]
    return {"none": 0.0860, "dedup": 0.0650}[path]


def test_a_close_call_then_a_clear_one_reads_as_one_line():
    lines = decision_lines(close_then_clear, 512)
    assert [line.split(" (")[0] for line in lines] == [
        "source step 13: dedup for now", "source step 63: timing both paths again", "source step 67: dedup"]
    [events] = events_of(lines).values()
    # steps 13-63 dedup, 63-67 both in turn (2 of 4 on dedup), 67-512 dedup
    assert dedup_share(events, 512) == (50 + 2 + 445) / (512 - 13)
    assert run_line(lines, 512) == ("source: dedup at step 13 for now, timed again at 63, dedup at step 67; "
                                    "dedup on 100% of the steps after the probe")  # 99.6%
    assert run_line(["source step 13: none (none kept: ...)"], 256) == \
        "source: none at step 13; dedup on 0% of the steps after the probe"
    assert run_line([], 256).startswith("no decision")


def _run_dir(root: Path, name: str, decisions: list[str], steps: int) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "comm_stats.json").write_text(json.dumps({"auto_decisions": decisions}))
    (run / "summary.json").write_text(json.dumps({"steps": steps}))
    return run


def test_the_runner_summary_says_per_auto_run_what_it_chose(tmp_path):
    from dlrmtrain.mlperf_runner import RunnerPlan, auto_choices, run_paths

    plan = RunnerPlan(config=tmp_path / "c.yaml", out=tmp_path, overrides=(), benchmark="dlrmv4",
                      codecs=("none", "auto"), runs=2, base_seed=3, nproc=2, backend="gloo",
                      ruleset="6.1.0", rules=None, timeout_s=60.0)
    first = run_paths(plan, "auto", 0)[0]
    _run_dir(first.parent, first.name, decision_lines(close_then_clear, 512), 512)
    assert auto_choices(plan, "none") == []
    lines = auto_choices(plan, "auto")
    assert lines[0] == "auto, seed 3: source: dedup at step 13 for now, timed again at 63, dedup at step 67; " \
                       "dedup on 100% of the steps after the probe"
    assert lines[1].startswith("auto, seed 4: no comm_stats.json in ")  # not run (yet)


def test_report_lists_each_auto_run_on_one_line(tmp_path):
    from dlrmtrain.report import auto_line, render_markdown

    comm = {"auto_decisions": ["source step 13: none (none kept: ...)"], "tables": {}}
    assert auto_line(comm, {"steps": 256}) == "source: none at step 13; dedup on 0% of the steps after the probe"

    class Run:  # the fields render_markdown reads of a RunData
        def __init__(self, name: str, codec: str, comm: dict | None) -> None:
            self.name, self.codec, self.comm, self.path, self.family, self.skipped = \
                name, codec, comm, tmp_path, "dlrmv4", []
            self.summary = {"world_size": 2, "steps": 256, "samples_per_second": 1.0}

    md = render_markdown([Run("run0_seed0", "none", None), Run("run0_seed0", "auto", comm)], [])
    assert "- run0_seed0 (auto): source: none at step 13; dedup on 0% of the steps after the probe" in md
    assert md.count("\n- run0_seed0") == 1


def test_the_counted_steps_give_the_exact_share_where_a_run_has_them():
    """A pipeline's batches picked before a re-timing keep their path (dedup), so the lines'
    estimate (the probe's span half on each path) reads low; the policy's count is exact."""
    from tests.comm.test_auto_policy import run

    p = AutoPolicy(warmup_steps=1, probe_steps=6, check_every=50, min_dwell=200)
    times = iter([0.0800, 0.0792] * 6 + [0.0800] * 2000)
    paths = run(p, lambda path: next(times), 256)
    steps, dedup = p.counted_steps()
    first = p.decisions[0].step
    assert (steps, dedup) == (256 - first, paths[first:].count("dedup"))  # every step after the first decision
    lines = [f"source {d.head()} (...)" for d in p.decisions]
    exact = run_line(lines, 256, {"source": {"steps": steps, "dedup": dedup}})
    assert exact.endswith(f"dedup on {dedup / steps:.1%} of the steps after the probe ({dedup} of {steps})")
    assert run_line(lines, 256, {"table_wise": {"steps": 9, "dedup": 9}}).endswith(
        "of the steps after the probe")  # another all-to-all's count is not this one's
