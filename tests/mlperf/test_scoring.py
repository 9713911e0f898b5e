"""MLPerf scoring on fixed run times and statuses, against hand-computed expectations."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest

from dlrmtrain.mlperf.compliance import USAGE, checker_logging_silenced
from dlrmtrain.mlperf.rules import DerivedRulesSpec
from dlrmtrain.mlperf.rules.derive import write_derived_rules
from dlrmtrain.mlperf.scoring import (
    RunTime,
    olympic_score,
    max_non_converged,
    required_runs,
    score_result_folder,
)
from dlrmtrain.mlperf.submission import SubmissionLayout, describe_system, write_system_description
from tests.mlperf.simulated_run import EVAL_SAMPLES, OFFICIAL_DLRMV4, SimulatedRun


def _runs(*minutes):
    return [RunTime(f"result_{i}.txt", m) for i, m in enumerate(minutes)]


def test_required_runs_are_mlperfs():
    assert required_runs("dlrm") == 5
    assert required_runs("dlrm_dcnv2") == 10
    # benchmark_meta (mlperf-logging 4.1.68): dlrmv4 10, scored as dlrm_dcnv2 (olympic
    # mean, one non-converged run allowed: the summarizer special-cases only unet3d).
    assert required_runs("dlrmv4") == 10
    assert max_non_converged("dlrmv4") == 1


def test_too_few_runs_say_so_rather_than_blame_convergence():
    score = olympic_score("dlrmv4", _runs(2.0))
    assert score.minutes is None
    assert "too few runs" in score.summary() and "non-converged runs)" not in score.summary()


def test_all_converged_drops_fastest_and_slowest():
    score = olympic_score("dlrm", _runs(10.0, 12.0, 11.0, 13.0, 14.0))
    assert score.minutes == pytest.approx((11 + 12 + 13) / 3)  # 12.0
    assert score.non_converged == 0 and score.enough_runs


def test_one_non_converged_run_is_allowed_and_counts_as_the_slowest():
    # Sorted converged: 10, 11, 12, 14; the failed run is the dropped slowest,
    # so only the fastest (10) is dropped from the converged ones.
    score = olympic_score("dlrm", _runs(10.0, 12.0, 11.0, None, 14.0))
    assert score.minutes == pytest.approx((11 + 12 + 14) / 3)  # 12.333…
    assert score.non_converged == 1


def test_two_non_converged_runs_give_no_score():
    score = olympic_score("dlrm", _runs(10.0, None, 11.0, None, 14.0))
    assert score.minutes is None
    assert "too many non-converged" in score.summary()


def test_dcnv2_ten_runs():
    minutes = [5.0, 7.0, 6.0, 9.0, 8.0, 4.0, 10.0, 6.5, 5.5, None]
    score = olympic_score("dlrm_dcnv2", _runs(*minutes))
    # converged sorted: 4, 5, 5.5, 6, 6.5, 7, 8, 9, 10 → drop 4; keep 8 values
    assert score.minutes == pytest.approx((5 + 5.5 + 6 + 6.5 + 7 + 8 + 9 + 10) / 8)


def test_fewer_runs_than_a_submission_needs_are_flagged():
    score = olympic_score("dlrm", _runs(3.0, 4.0, 5.0))
    assert score.minutes == pytest.approx(4.0)
    assert not score.enough_runs and "only 3 of the 5" in score.summary()


def _write_folder(folder, benchmark, minutes_and_aucs, eval_samples=EVAL_SAMPLES):
    folder.mkdir(parents=True)
    for i, (minutes, aucs) in enumerate(minutes_and_aucs):
        status = "success" if max(aucs) >= 0.75 else "aborted"
        full_size = dict(dlrmv4=OFFICIAL_DLRMV4) if benchmark == "dlrmv4" else {}
        SimulatedRun(benchmark, aucs=aucs, run_minutes=minutes, status=status,
                     eval_samples=eval_samples, **full_size).write(folder / f"result_{i}.txt")


def test_result_folder_with_derived_rules_reads_times_and_convergence(tmp_path):
    reached, missed = (0.72, 0.77), (0.70, 0.74)
    _write_folder(tmp_path / "dlrm", "dlrm", [
        (2.0, reached), (3.0, reached), (2.5, missed), (4.0, reached), (1.5, reached)])
    rules = write_derived_rules(DerivedRulesSpec("dlrm", "2.1.0", 0.75), tmp_path / "rules")

    score, checks = score_result_folder(tmp_path / "dlrm", "dlrm", "2.1.0", rules)

    assert [c.passed for c in checks] == [True, True, False, True, True]
    assert [r.minutes for r in score.runs] == pytest.approx([2.0, 3.0, None, 4.0, 1.5])
    # converged sorted 1.5, 2, 3, 4; one failure allowed → drop 1.5 → mean(2, 3, 4)
    assert score.minutes == pytest.approx(3.0)


def summarizer_score(layout: SubmissionLayout, ruleset: str) -> float | None:
    """The package's own score of `layout`'s results, through its public `summarize_results`."""
    from mlperf_logging.result_summarizer.result_summarizer import summarize_results

    desc = describe_system(layout.system, submitter="dlrmtrain", division="open", nodes=1,
                           processes_per_node=2, backend="gloo", codec="none", notes="test")
    write_system_description(layout, desc, ruleset)
    # It prints a notice per dropped run and logs the checker's messages.
    with redirect_stdout(io.StringIO()), checker_logging_silenced():
        strong, *_ = summarize_results(str(layout.root), USAGE, ruleset)
    score = strong.loc[0, layout.benchmark]
    return None if score is None or score != score else float(score)  # NaN: no score


@pytest.mark.parametrize("benchmark,ruleset,official_auc,eval_samples,failed", [
    ("dlrm", "2.1.0", 0.8030, EVAL_SAMPLES, 1),
    ("dlrm", "2.1.0", 0.8030, EVAL_SAMPLES, 0),
    ("dlrm", "2.1.0", 0.8030, EVAL_SAMPLES, 2),
    ("dlrm_dcnv2", "6.0.0", 0.8030, 89137319, 1),
    ("dlrmv4", "6.1.0", 0.7512, 2058204, 1),
])
def test_folder_score_matches_the_result_summarizer_under_official_rules(
        tmp_path, benchmark, ruleset, official_auc, eval_samples, failed):
    # Logs that meet the official target but `failed` of them: our scoring and the
    # package's own summarizer must agree (two failures: neither gives a score).
    minutes = [6.0, 5.0, 7.5, 5.5, 4.0, 6.5, 7.0, 5.2, 6.1, 5.9][:required_runs(benchmark)]
    runs = [(m, (0.74, official_auc) if i >= failed else (0.70, 0.72)) for i, m in enumerate(minutes)]
    layout = SubmissionLayout(tmp_path, "cpu2_gloo_codec-none", benchmark)
    _write_folder(layout.result_dir, benchmark, runs, eval_samples=eval_samples)

    ours, checks = score_result_folder(layout.result_dir, benchmark, ruleset)
    theirs = summarizer_score(layout, ruleset)

    assert sum(not c.passed for c in checks) == failed
    if failed > max_non_converged(benchmark):
        assert ours.minutes is None and theirs is None
    else:
        assert theirs is not None and ours.minutes == pytest.approx(theirs, rel=1e-12)
