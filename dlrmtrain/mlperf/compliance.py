"""Run the official MLPerf compliance checker on a log and say which rules failed.

This calls the installed ``mlperf_logging.compliance_checker`` in-process —
the same ``make_checker`` + ``main`` the CLI runs — and reads its messages back
as structured `RuleFailure`s instead of log text. Rules are either the official
ones (``training_<ruleset>/common.yaml`` and what it chains to) or a derived,
unofficial file (dlrmtrain/mlperf/rules) passed like the CLI's ``--config``.

The equivalent command line is in `ComplianceResult.command`.
"""

from __future__ import annotations

import logging
import re
import shlex
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from mlperf_logging.compliance_checker import mlp_compliance

USAGE = "training"
DEFAULT_RULESET = {"dlrm": "2.1.0", "dlrm_dcnv2": "6.0.0", "dlrmv4": "6.1.0"}

_AT_LEAST_ONE = re.compile(r"^Failed checks for (\w+) : ")
_ALTERNATIVES = re.compile(r"^Required AT_LEAST_ONE occurrence of ((?:'\w+'(?: or )?)+)$")


@dataclass(frozen=True)
class RuleFailure:
    """One failed rule: the log key it guards (None for whole-log checks) and the checker's text."""

    key: str | None
    message: str


@dataclass(frozen=True)
class ComplianceResult:
    log_path: Path
    ruleset: str
    config: str
    """The rules file: official ``training_<ruleset>/common.yaml`` or a derived file's path."""
    failures: tuple[RuleFailure, ...]
    warnings: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def official(self) -> bool:
        return not Path(self.config).is_absolute()

    @property
    def failed_keys(self) -> set[str | None]:
        return {f.key for f in self.failures}

    @property
    def command(self) -> str:
        """The checker CLI call that reproduces this result."""
        args = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", USAGE,
                "--ruleset", self.ruleset]
        if not self.official:
            args += ["--config", self.config]
        return shlex.join(args + [str(self.log_path)])

    def summary(self) -> str:
        rules = "official" if self.official else f"UNOFFICIAL derived ({Path(self.config).name})"
        if self.passed:
            return f"{self.log_path.name}: PASSED {rules} rules {self.ruleset}"
        keys = ", ".join(sorted(str(k) for k in self.failed_keys))
        return f"{self.log_path.name}: FAILED {rules} rules {self.ruleset} on: {keys}"


def check_log(log_path: Path | str, ruleset: str, config: Path | str | None = None) -> ComplianceResult:
    """Check `log_path` against ruleset `ruleset` (official rules when `config` is None).

    `config` is a derived rules file; the checker resolves configs relative to
    its own package, so it is passed as an absolute path.
    """
    log_path = Path(log_path)
    if not log_path.is_file():
        raise FileNotFoundError(f"MLPerf log {log_path} does not exist")
    if config is None:
        config_name = f"{USAGE}_{ruleset}/common.yaml"
    else:
        config_path = Path(config).resolve()
        if not config_path.is_file():
            raise FileNotFoundError(f"compliance rules file {config_path} does not exist")
        config_name = str(config_path)
    checker = mlp_compliance.make_checker(USAGE, ruleset, quiet=False, werror=False)
    with checker_logging_silenced():
        mlp_compliance.main(str(log_path), config_name, checker)
    return ComplianceResult(log_path, ruleset, config_name, _failures(checker),
                            tuple(checker.warnings.values()))


def _failures(checker: mlp_compliance.ComplianceChecker) -> tuple[RuleFailure, ...]:
    # overwritable messages are keyed by the log key whose rule failed; the
    # others are whole-log checks (END blocks, AT_LEAST_ONE_OR, ATLEAST_ONE_CHECK).
    failures = [RuleFailure(key, msg) for key, msg in checker.overwritable.items()]
    for msg in checker.not_overwritable:
        failures.append(RuleFailure(_key_of_whole_log_message(msg), msg))
    return tuple(failures)


def _key_of_whole_log_message(message: str) -> str | None:
    if m := _AT_LEAST_ONE.match(message):
        return m.group(1)
    if m := _ALTERNATIVES.match(message):
        return " or ".join(sorted(re.findall(r"'(\w+)'", m.group(1))))
    return None


@contextmanager
def checker_logging_silenced() -> Iterator[None]:
    # The checker reports through the root logger; our result carries the same
    # messages, so keep them off the console while it runs.
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


RCP_FILES = {"dlrm_dcnv2": "training_6.0.0/rcps_dlrm_dcnv2.json",
             "dlrmv4": "training_6.1.0/rcps_dlrmv4.json"}
"""The reference convergence points the installed mlperf-logging ships, per benchmark."""


@dataclass(frozen=True)
class RcpVerdict:
    """The official RCP checker's verdict on one results folder (the package checker's call)."""

    passed: bool
    message: str
    """The checker's own words: 'RCP found', 'Insufficient convergence', 'Missing RCP, ...'."""
    norm_factor: float
    rcp_file: str

    def line(self) -> str:
        why = {"Insufficient convergence": "more than one run missed the target",
               "Could not detect global_batch_size": "no global_batch_size in the logs",
               "RCP found": ("the runs' mean samples to converge (fastest and slowest dropped) "
                             + ("is within the reference's" if self.passed else
                                "is below the fastest the reference allows")
                             + " at this global batch"),
               "RCP not found but slower convergence on smaller batch size": (
                   "no reference point at this global batch; the runs converge no faster than "
                   "the smallest-batch one, which the checker accepts"),
               "RCP Interpolation": "checked against the points interpolated between two batches"}
        missing = ("no reference point at this global batch, and the runs converge faster than "
                   "the nearest one the checker holds them to allows: a submission must bring "
                   "its own RCPs at this batch")
        reason = why.get(self.message, missing if self.message.startswith("Missing RCP") else "")
        return (f"RCP check ({self.rcp_file}, pruned): {'PASS' if self.passed else 'FAIL'}: "
                f"{self.message}" + (f" ({reason})" if reason else "")
                + (f"; score normalised by {self.norm_factor:.4f}"
                   if self.passed and self.norm_factor != 1.0 else ""))


def rcp_verdict(folder: Path | str, benchmark: str, ruleset: str) -> RcpVerdict | None:
    """The RCP check the official package checker runs on a closed-division results folder
    (`rcp_checker.check_directory`, pruned RCPs, no bypass; nothing written to the folder).
    None where mlperf-logging ships no RCPs for `benchmark` (DLRM v1 needs none)."""
    from mlperf_logging.rcp_checker import rcp_checker

    if benchmark not in RCP_FILES:
        return None
    # a folder of fewer than 3 runs leaves the checker a mean of nothing (NaN, with a warning)
    with checker_logging_silenced(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        passed, message, norm = rcp_checker.check_directory(
            str(folder), USAGE, ruleset, verbose=False, bert_train_samples=False,
            rcp_pass="pruned_rcps", rcp_bypass=False, set_scaling=False)
    return RcpVerdict(bool(passed), message, float(norm), RCP_FILES[benchmark])
