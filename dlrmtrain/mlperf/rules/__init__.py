"""UNOFFICIAL MLPerf compliance rules for small runs (derive.py says how and why).

The YAML files in ``training_<ruleset>/`` are generated, not hand-written:
the official rules of the installed mlperf-logging with only the accuracy
target (and, for dlrm_dcnv2, the eval size) changed. Each file's header names
its sources and their hashes. The committed ones are for
``configs/mini_mlperf.yaml``; the MLPerf runner writes its own next to its
results for any other target. Regenerate with
``python -m dlrmtrain.mlperf.rules.derive``.

A log that passes them is NOT an MLPerf-compliant result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RULES_DIR = Path(__file__).parent

# What the official rules hard-code (derive.py asserts these are in the official files).
OFFICIAL_TARGET = {"dlrm": "0.8025", "dlrm_dcnv2": "0.80275"}
OFFICIAL_EVAL_SAMPLES = {"dlrm_dcnv2": "89137319"}
RULESETS = {"dlrm": ("0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0"), "dlrm_dcnv2": ("6.0.0",)}

# configs/mini_mlperf.yaml: target AUC and eval split size (the last 20% of the
# 49,285-row real sample); the dcnv2 file is for the same data run as dlrm_dcnv2.
MINI_TARGET_AUC = 0.70
MINI_EVAL_SAMPLES = 9857


@dataclass(frozen=True)
class DerivedRulesSpec:
    """What a set of derived rules is for."""

    benchmark: str
    ruleset: str
    target: float
    eval_samples: int | None = None
    """Required eval size (dlrm_dcnv2 only: the dlrm rules do not check it)."""

    def filename(self) -> str:
        size = f"_eval{self.eval_samples}" if self.eval_samples is not None else ""
        return f"unofficial_closed_{self.benchmark}_auc{self.target:g}{size}.yaml"


COMMITTED_SPECS: tuple[DerivedRulesSpec, ...] = (
    *(DerivedRulesSpec("dlrm", r, MINI_TARGET_AUC) for r in RULESETS["dlrm"]),
    DerivedRulesSpec("dlrm_dcnv2", "6.0.0", MINI_TARGET_AUC, MINI_EVAL_SAMPLES),
)


def committed_rules_path(spec: DerivedRulesSpec) -> Path:
    """Where the committed file for `spec` lives (raises if it was never generated)."""
    path = RULES_DIR / f"training_{spec.ruleset}" / spec.filename()
    if not path.is_file():
        raise FileNotFoundError(f"no committed derived rules {path}; generate them with "
                                "`python -m dlrmtrain.mlperf.rules.derive`")
    return path
