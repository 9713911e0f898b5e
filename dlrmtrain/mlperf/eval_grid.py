"""When a dlrmv4 run evaluates: the grid of the closed rules and its first point.

The rules (mlperf-logging ``training_6.1.0/closed_dlrmv4.yaml``) accept an
``eval_accuracy`` only at a global step that is a multiple of

    interval_steps = max(1, ceil(eval_every_data_pct * train_samples / global_batch_size))

(their ``samples_count`` metadata, step × global batch, a multiple of
interval_steps × global batch), and the first one only at the first grid point
at or after a threshold in samples. The official threshold follows the global
batch (a fit through the reference's convergence sweep, less two blocks):

    floor((4480 · global_batch_size + 135,331,840) / 3)   → block 25 at 8192

A run may instead name the threshold as the reference's ``skip_eval_epoch_pct``:
no eval before ``ceil(pct · train_samples / global_batch_size)`` steps
(mlcommons/training recommendation_v4, PR #889: ``resolve_skip_eval_until_step``).
Small runs do that (their derived rules carry the same expression); at the
closed rules' numbers 0.025 lands on the same block 25 as the official formula.

Every number here is computed with the same float expressions, in the same
order, as the rules, so the grid the trainer follows is the one they check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The closed rules' eval spacing (eval_every_data_pct) and first-eval fit.
OFFICIAL_EVAL_EVERY_DATA_PCT = 0.001
FIRST_EVAL_SLOPE, FIRST_EVAL_INTERCEPT, FIRST_EVAL_DIVISOR = 4480, 135331840, 3


def official_first_eval_threshold(global_batch_size: int) -> int:
    """Samples before which the closed rules allow no eval, for this global batch."""
    return math.floor((FIRST_EVAL_SLOPE * global_batch_size + FIRST_EVAL_INTERCEPT)
                      / FIRST_EVAL_DIVISOR)


def skip_threshold(skip_eval_epoch_pct: float, train_samples: int, global_batch_size: int) -> int:
    """The reference's skip fraction as a threshold in samples (a whole number of steps;
    at least one step, since step 0 is never evaluated)."""
    steps = max(1, math.ceil(skip_eval_epoch_pct * train_samples / global_batch_size))
    return steps * global_batch_size


@dataclass(frozen=True)
class EvalGrid:
    """The global steps at which a dlrmv4 run evaluates (and logs eval_accuracy)."""

    train_samples: int
    global_batch_size: int
    interval_steps: int
    first_eval_step: int
    skip_eval_epoch_pct: float
    """The first eval's threshold as a fraction of the train samples (what the log reports)."""

    @classmethod
    def build(cls, train_samples: int, global_batch_size: int, eval_every_data_pct: float,
              skip_eval_epoch_pct: float | None = None) -> EvalGrid:
        """The grid of the rules for these numbers; `skip_eval_epoch_pct` None: the
        closed rules' first eval for this global batch."""
        if not 0 < eval_every_data_pct <= 1:
            raise ValueError(f"mlperf.eval_every_data_pct must be in (0, 1], got {eval_every_data_pct!r}")
        if skip_eval_epoch_pct is not None and not 0 <= skip_eval_epoch_pct < 1:
            raise ValueError(f"mlperf.skip_eval_epoch_pct must be in [0, 1), got {skip_eval_epoch_pct!r}")
        if train_samples <= 0 or global_batch_size <= 0:
            raise ValueError(f"train samples ({train_samples}) and global batch "
                             f"({global_batch_size}) must be positive")
        interval = max(1, int(math.ceil(eval_every_data_pct * train_samples / global_batch_size)))
        interval_samples = interval * global_batch_size
        threshold = (official_first_eval_threshold(global_batch_size) if skip_eval_epoch_pct is None
                     else skip_threshold(skip_eval_epoch_pct, train_samples, global_batch_size))
        first_samples = int(math.ceil(threshold / interval_samples)) * interval_samples
        pct = threshold / train_samples if skip_eval_epoch_pct is None else skip_eval_epoch_pct
        grid = cls(train_samples, global_batch_size, interval, first_samples // global_batch_size,
                   pct)
        if grid.first_eval_samples > train_samples:
            why = ("the closed rules' first eval for this global batch" if skip_eval_epoch_pct is None
                   else f"mlperf.skip_eval_epoch_pct={skip_eval_epoch_pct}")
            raise ValueError(f"{why} is at {grid.first_eval_samples:,} samples, beyond the "
                             f"{train_samples:,} a run trains on: the run would never evaluate; "
                             "set mlperf.skip_eval_epoch_pct (a fraction of the train samples)")
        return grid

    @property
    def interval_samples(self) -> int:
        return self.interval_steps * self.global_batch_size

    @property
    def first_eval_samples(self) -> int:
        return self.first_eval_step * self.global_batch_size

    def is_eval_step(self, step: int) -> bool:
        """Whether to evaluate after global step `step` (1-based count of steps done)."""
        return step >= self.first_eval_step and step % self.interval_steps == 0

    def samples_count(self, step: int) -> int:
        return step * self.global_batch_size


def eval_grid_for_config(cfg, train_samples: int) -> EvalGrid:
    """The grid a dlrmv4 run with this config evaluates on (mlperf.eval_every_data_pct,
    mlperf.skip_eval_epoch_pct; errors name those keys)."""
    m = cfg.mlperf
    return EvalGrid.build(train_samples, cfg.run.global_batch_size,
                          getattr(m, "eval_every_data_pct", OFFICIAL_EVAL_EVERY_DATA_PCT),
                          getattr(m, "skip_eval_epoch_pct", None))
