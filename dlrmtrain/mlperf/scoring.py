"""MLPerf time-to-train scoring, as ``mlperf_logging.result_summarizer`` does it.

The summarizer's rules (``_compute_strong_score_standalone``, mlperf-logging 4.1.68):

- a run's score is ``run_stop - run_start`` in minutes;
- a result file that fails the compliance check (e.g. never reached the
  target accuracy) is a *non-converged* run and is dropped; it counts as
  the slowest run;
- at most one non-converged run is allowed (four for unet3d); more gives no
  score ("CRITICAL ERROR: Too many non-converging runs");
- the score is the olympic mean: sort, drop the fastest and the slowest
  (a dropped non-converged run already stands in for the slowest), average
  the rest;
- the number of runs an official submission needs per benchmark comes from
  ``benchmark_meta`` (dlrm 5, dlrm_dcnv2 10, dlrmv4 10; dlrmv4 is scored like the others).

The package offers these rules only through private functions or a whole
submission tree (``summarize_results``), so the arithmetic and the reading of
the times are this module's own; the compliance step is ours too, so that
derived (unofficial) rules can decide convergence for small runs.
tests/mlperf/test_scoring.py checks the scores against ``summarize_results``
on a submission tree under official rules.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.compliance_checker.mlp_parser import parse_file

from dlrmtrain.mlperf.compliance import USAGE, ComplianceResult, check_log


def max_non_converged(benchmark: str) -> int:
    """Non-converged runs the summarizer tolerates (hard-coded there, mirrored here)."""
    return 4 if benchmark == "unet3d" else 1


def olympic_mean(converged: list[float], dropped: int, max_dropped: int) -> float | None:
    """Mean of the converged times less the `max_dropped` fastest and as many slowest, the
    `dropped` (non-converged) runs standing in for that many of the slowest; None when
    nothing is left to average."""
    kept = sorted(converged)[max_dropped:len(converged) - (max_dropped - dropped)]
    return sum(kept) / len(kept) if kept else None


def required_runs(benchmark: str) -> int:
    return get_result_file_counts(USAGE)[benchmark]


@dataclass(frozen=True)
class RunTime:
    """One run: its time to train in minutes, or None when it did not converge."""

    name: str
    minutes: float | None


@dataclass(frozen=True)
class BenchmarkScore:
    benchmark: str
    minutes: float | None
    """Olympic mean time to train; None when too many runs did not converge."""
    runs: tuple[RunTime, ...]
    required_runs: int
    max_non_converged: int

    @property
    def non_converged(self) -> int:
        return sum(r.minutes is None for r in self.runs)

    @property
    def enough_runs(self) -> bool:
        return len(self.runs) >= self.required_runs

    def summary(self) -> str:
        if self.minutes is not None:
            score = f"{self.minutes:.4f} min (olympic mean)"
        elif self.non_converged > self.max_non_converged:
            score = "no score (too many non-converged runs)"
        else:  # the mean drops the fastest and the slowest: nothing left to average
            score = "no score (too few runs for the olympic mean)"
        note = "" if self.enough_runs else \
            f"; only {len(self.runs)} of the {self.required_runs} runs a submission needs"
        return (f"{self.benchmark}: {score}; {len(self.runs)} runs, "
                f"{self.non_converged} non-converged (max {self.max_non_converged}){note}")


def olympic_score(benchmark: str, runs: list[RunTime] | tuple[RunTime, ...]) -> BenchmarkScore:
    """Score runs the way the result summarizer does (see the module docstring)."""
    if not runs:
        raise ValueError(f"no runs to score for {benchmark}")
    limit = max_non_converged(benchmark)
    converged = [r.minutes for r in runs if r.minutes is not None]
    dropped = len(runs) - len(converged)
    minutes = None
    if dropped <= limit:
        minutes = olympic_mean(converged, dropped, limit)
    return BenchmarkScore(benchmark, minutes, tuple(runs), required_runs(benchmark), limit)


def run_time_minutes(log_path: Path | str, ruleset: str) -> float:
    """``run_stop - run_start`` of one log, in minutes (the summarizer's reading)."""
    loglines, errors = parse_file(str(log_path), ruleset=ruleset)
    if errors:
        raise ValueError(f"{log_path}: {len(errors)} unparsable MLPerf lines, first: {errors[0]}")
    # Read as the summarizer does: each key's latest value until both are seen (ms).
    times: dict[str, float] = {}
    for line in loglines:
        if line.key in ("run_start", "run_stop"):
            times[line.key] = float(line.timestamp)
            if len(times) == 2:
                break
    for key in ("run_start", "run_stop"):
        if key not in times:
            raise ValueError(f"{log_path}: {key} not recorded")
    return (times["run_stop"] - times["run_start"]) / 60 / 1000


def score_result_folder(folder: Path | str, benchmark: str, ruleset: str,
                        config: Path | str | None = None
                        ) -> tuple[BenchmarkScore, list[ComplianceResult]]:
    """Check and score every ``result_*.txt`` in `folder` (official rules if `config` is None)."""
    files = sorted(Path(p) for p in glob.glob(f"{folder}/result_*.txt"))
    if not files:
        raise FileNotFoundError(f"no result_*.txt files in {folder}")
    checks = [check_log(f, ruleset, config) for f in files]
    runs = [RunTime(c.log_path.name, run_time_minutes(c.log_path, ruleset) if c.passed else None)
            for c in checks]
    return olympic_score(benchmark, runs), checks


def eval_time_share(log_path: Path | str, ruleset: str) -> float | None:
    """Share of run_start → run_stop spent between eval_start and eval_stop (the reference
    spends ~29% of its wall time evaluating when it evaluates at every grid point); None
    for a log that has no run_stop."""
    loglines, errors = parse_file(str(log_path), ruleset=ruleset)
    if errors:
        raise ValueError(f"{log_path}: {len(errors)} unparsable MLPerf lines, first: {errors[0]}")
    times = {line.key: line.timestamp for line in loglines if line.key in ("run_start", "run_stop")}
    if len(times) < 2 or times["run_stop"] <= times["run_start"]:
        return None
    began: float | None = None
    evaluating = 0.0
    for line in loglines:
        if line.key == "eval_start":
            began = line.timestamp
        elif line.key == "eval_stop" and began is not None:
            evaluating, began = evaluating + line.timestamp - began, None
    return evaluating / (times["run_stop"] - times["run_start"])
