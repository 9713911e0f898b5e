"""UNOFFICIAL MLPerf compliance rules for small runs (see derive.py for how and why).

The YAML files in ``training_<ruleset>/`` are generated, not hand-written:
the official rules of the installed mlperf-logging with only the accuracy
target (and, for dlrm_dcnv2, the eval size) changed. Each file's header names
its sources and their hashes. They are for ``configs/mini_mlperf.yaml``;
the MLPerf runner writes its own next to its results for any other target.

A log that passes them is NOT an MLPerf-compliant result.
"""

from __future__ import annotations

from pathlib import Path

from dlrmtrain.metrics.rules.derive import RULES_DIR, DerivedRulesSpec

# configs/mini_mlperf.yaml: target AUC and eval split size (rows of the real sample).
MINI_TARGET_AUC = 0.75
MINI_EVAL_SAMPLES = 9285

COMMITTED_SPECS: tuple[DerivedRulesSpec, ...] = (
    *(DerivedRulesSpec("dlrm", r, MINI_TARGET_AUC) for r in ("0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0")),
    DerivedRulesSpec("dlrm_dcnv2", "6.0.0", MINI_TARGET_AUC, MINI_EVAL_SAMPLES),
)


def committed_rules_path(spec: DerivedRulesSpec) -> Path:
    """Where the committed file for `spec` lives (raises if it was never generated)."""
    path = RULES_DIR / f"training_{spec.ruleset}" / spec.filename()
    if not path.is_file():
        raise FileNotFoundError(f"no committed derived rules {path}; generate them with "
                                "`python -m dlrmtrain.metrics.rules.derive`")
    return path
