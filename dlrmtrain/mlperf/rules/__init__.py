"""UNOFFICIAL MLPerf compliance rules for small runs (derive.py says how and why).

The YAML files in ``training_<ruleset>/`` are generated, not hand-written:
the official rules of the installed mlperf-logging with only the accuracy
target (and, for dlrm_dcnv2 and dlrmv4, the eval size; for dlrmv4 also the
numbers its rules tie to the full-size run, `Dlrmv4Scale`) changed. Each file's header names
its sources and their hashes. The committed ones are for
``configs/mini_mlperf.yaml``; the MLPerf runner writes its own next to its
results for any other target. Regenerate with
``python -m dlrmtrain.mlperf.rules.derive``.

A log that passes them is NOT an MLPerf-compliant result.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

RULES_DIR = Path(__file__).parent

# What the official rules hard-code (derive.py asserts these are in the official files).
OFFICIAL_TARGET = {"dlrm": "0.8025", "dlrm_dcnv2": "0.80275", "dlrmv4": "0.75"}
OFFICIAL_EVAL_SAMPLES = {"dlrm_dcnv2": "89137319", "dlrmv4": "2058204"}
RULESETS = {"dlrm": ("0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0"), "dlrm_dcnv2": ("6.0.0",),
            "dlrmv4": ("6.1.0",)}

# configs/mini_mlperf.yaml: target AUC and eval split size (the last 20% of the
# 49,285-row real sample); the dcnv2 file is for the same data run as dlrm_dcnv2.
MINI_TARGET_AUC = 0.70
MINI_EVAL_SAMPLES = 9857


@dataclass(frozen=True)
class Dlrmv4Scale:
    """The numbers dlrmv4's rules tie to the full-size run, for a smaller one.

    Each replaces one number of ``closed_dlrmv4.yaml`` (official value in brackets);
    the rules' structure (eval grid, first-eval point, learning-rate band scaled by
    the global batch, every other fixed hyperparameter) stays.
    """

    train_samples: int
    """train_samples, and the eval grid's denominator [2,290,835,423]."""
    max_sequence_length: int
    """[4096]"""
    warmup_steps: int
    """opt_learning_rate_warmup_steps [24,000]."""
    reference_lr: float
    """Learning rate at global batch 8192 the 0.5–1.5× band is centred on [1e-6]."""
    eval_every_data_pct: float
    """Eval spacing, a fraction of train_samples [0.001]."""
    skip_eval_epoch_pct: float | None
    """First eval: the first grid point at or after ceil(pct × train_samples / batch)
    steps; None keeps the official fit [floor((4480 × batch + 135,331,840) / 3) samples]."""


@dataclass(frozen=True)
class DerivedRulesSpec:
    """What a set of derived rules is for."""

    benchmark: str
    ruleset: str
    target: float
    eval_samples: int | None = None
    """Required eval size (dlrm_dcnv2, dlrmv4: the dlrm rules do not check it)."""
    scale: Dlrmv4Scale | None = None
    """dlrmv4 only (required there)."""

    def filename(self) -> str:
        size = f"_eval{self.eval_samples}" if self.eval_samples is not None else ""
        if self.scale is not None:
            # The other numbers of the scale, by digest: one file per distinct rules.
            digest = hashlib.sha256(repr(self.scale).encode()).hexdigest()[:8]
            size += f"_train{self.scale.train_samples}_{digest}"
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
