"""MLPerf's convergence check: the official RCP checker (mlperf-logging's rcp_checker, the
call its package checker makes) on dlrmv4 result folders, and the eval share of a run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dlrmtrain.mlperf.compliance import rcp_verdict
from tests.mlperf.simulated_run import OFFICIAL_DLRMV4, SimulatedRun

MISS, TARGET = 0.70, 0.7512  # dlrmv4's official target is 0.75


def _folder(tmp_path, converged_at: list[int | None], numbers=OFFICIAL_DLRMV4):
    """One result file per run, converging at its eval number (1-based; None: never). At
    batch 8192 the first eval comes at 2.5% of the epoch (57.3M samples), then one every
    2,293,760 samples; the RCPs' mean is ~69M samples (the 6th eval)."""
    folder = tmp_path / "results"
    folder.mkdir(parents=True)
    for i, at in enumerate(converged_at):
        aucs = (MISS,) * 40 if at is None else (MISS,) * (at - 1) + (TARGET,)
        SimulatedRun("dlrmv4", aucs=aucs, status="aborted" if at is None else "success",
                     dlrmv4=numbers, eval_samples=numbers.eval_samples,
                     stop_inside_epoch=True).write(folder / f"result_{i}.txt")
    return folder


def test_runs_converging_where_the_reference_does_pass(tmp_path):
    verdict = rcp_verdict(_folder(tmp_path, [6, 5, 6, 7, 6, 5, 7, 6, 8, 6]),
                          "dlrmv4", "6.1.0")
    assert verdict.passed and verdict.message == "RCP found"
    assert verdict.line().startswith("RCP check (training_6.1.0/rcps_dlrmv4.json, pruned): PASS")


def test_runs_converging_far_faster_than_the_reference_fail(tmp_path):
    verdict = rcp_verdict(_folder(tmp_path, [1] * 10), "dlrmv4", "6.1.0")
    assert not verdict.passed and verdict.message == "RCP found"
    assert "below the fastest the reference allows" in verdict.line()


def test_two_runs_that_never_converge_fail_before_any_rcp(tmp_path):
    verdict = rcp_verdict(_folder(tmp_path, [6] * 8 + [None, None]), "dlrmv4", "6.1.0")
    assert not verdict.passed and verdict.message == "Insufficient convergence"


def test_a_small_batch_without_reference_points_is_held_to_the_smallest_batchs(tmp_path):
    # batch 256 converging at ~69M samples: faster than batch 8192's reference (pruned mean)
    small = replace(OFFICIAL_DLRMV4, global_batch_size=256)
    verdict = rcp_verdict(_folder(tmp_path, [6] * 10, small), "dlrmv4", "6.1.0")
    assert not verdict.passed
    assert verdict.message == "Missing RCP, please submit RCP with BS = 256"
    assert "must bring its own RCPs" in verdict.line()


def test_dlrm_v1_has_no_rcps_to_check(tmp_path):
    assert rcp_verdict(tmp_path, "dlrm", "2.1.0") is None


def test_the_summary_names_the_reference_default_and_prints_the_verdict(tmp_path):
    from types import SimpleNamespace

    from dlrmtrain.mlperf.compliance import RcpVerdict
    from dlrmtrain.mlperf_runner import CodecOutcome, render_summary
    from dlrmtrain.mlperf.scoring import RunTime, olympic_score

    plan = SimpleNamespace(rules=None, benchmark="dlrmv4", ruleset="6.1.0", runs=1, nodes=1,
                           nproc=2, backend="gloo", out=tmp_path, describe_link=lambda: "")
    verdict = RcpVerdict(False, "Insufficient convergence", 1.0, "training_6.1.0/rcps_dlrmv4.json")
    outcomes = [CodecOutcome(c, olympic_score("dlrmv4", [RunTime("result_0.txt", None)]), (),
                             verdict, 0.25) for c in ("dedup", "dedup+fp16")]
    text = render_summary(plan, outcomes)
    assert "codec dedup+fp16: reference default (index dedup + fp16, LOSSY)" in text
    assert "codec dedup " in text and "codec dedup:" not in text
    assert "evaluation: 25.0% of the wall time" in text
    assert ("RCP check (training_6.1.0/rcps_dlrmv4.json, pruned): FAIL: Insufficient convergence "
            "(more than one run missed the target)") in text
    # the report's legend names it alike, on dlrmv4 only
    from dlrmtrain.report import RunData
    run = RunData(tmp_path, "run0_seed0", "dedup+fp16", 128, 0.685, {}, benchmark="dlrmv4")
    assert run.label == "run0_seed0 (dedup+fp16: reference default (index dedup + fp16, LOSSY))"
    assert RunData(tmp_path, "r", "dedup+fp16", 128, 0.8, {}, benchmark="dlrm_dcnv2").label == \
        "r (dedup+fp16)"


def test_eval_share_is_the_time_between_eval_start_and_eval_stop(tmp_path):
    from dlrmtrain.mlperf.logger import build_mlperf_logger
    from dlrmtrain.mlperf.scoring import eval_time_share
    from tests.mlperf.simulated_run import ManualClock

    clock, log = ManualClock(), tmp_path / "result_0.txt"
    with build_mlperf_logger("dlrmv4", log, 0, clock=clock) as logger:
        logger.run_start()
        clock.now_ms += 3_000            # training
        logger.eval_start(0.5, 100)
        clock.now_ms += 1_000            # evaluating
        logger.eval_stop(0.5, 100)
        assert eval_time_share(log, "6.1.0") is None  # no run_stop yet
        logger.run_stop("success", 1.0, 200)
    assert eval_time_share(log, "6.1.0") == pytest.approx(0.25)
