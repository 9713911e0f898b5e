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
