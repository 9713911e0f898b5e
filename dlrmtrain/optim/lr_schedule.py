"""The MLPerf DLRM learning-rate policy: linear warmup, then polynomial (power 2) decay.

Follows the MLPerf v1 reference (facebookresearch/dlrm `LRPolicyScheduler`)
step for step. Steps count from 1: the first training step uses the rate for
step 1. With W warmup steps, D decay steps starting at S:
  step < W            base · step / W
  S ≤ step < S + D    max(1e-7, base · ((D − (step − S)) / D)²)   (to end_lr)
  otherwise           the last rate set (frozen) if D > 0, else base.
Between the end of warmup and the start of decay the reference therefore
holds base · (W − 1) / W, not base; we keep that quirk so learning rates mean
what they mean in MLPerf.
"""

from __future__ import annotations

from typing import Iterable

_MIN_LR = 1e-7


class MLPerfLRSchedule:
    """Computes the rate per step and writes it into optimizers' param groups."""

    def __init__(self, base_lr: float, warmup_steps: int = 0, decay_start_step: int = 0,
                 decay_steps: int = 0, end_lr: float = 0.0) -> None:
        if decay_steps and decay_start_step < warmup_steps:
            raise ValueError(f"optim.decay_start_step ({decay_start_step}) must not precede the "
                             f"end of warmup ({warmup_steps})")
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.decay_start_step = decay_start_step
        self.decay_steps = decay_steps
        self.end_lr = end_lr
        self._last_lr = base_lr  # the rate "frozen" outside warmup and decay

    def lr_at(self, step: int) -> float:
        """The rate for training step `step` (1-based). Steps must be asked in order
        for the frozen phases, as in training; `rates` does that for a range."""
        if step < self.warmup_steps:
            self._last_lr = self.base_lr * (1.0 - (self.warmup_steps - step) / self.warmup_steps)
        elif self.decay_start_step <= step < self.decay_start_step + self.decay_steps:
            decayed = step - self.decay_start_step
            scale = ((self.decay_steps - decayed) / self.decay_steps) ** 2
            self._last_lr = max(_MIN_LR, self.end_lr + (self.base_lr - self.end_lr) * scale)
        elif self.decay_steps == 0:
            return self.base_lr
        return self._last_lr

    def rates(self, steps: Iterable[int]) -> list[float]:
        return [self.lr_at(s) for s in steps]

    def apply(self, step: int, optimizers: Iterable) -> float:
        """Set the rate for `step` on every param group of every optimizer."""
        lr = self.lr_at(step)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        return lr

    def state_dict(self) -> dict:
        return {"last_lr": self._last_lr}

    def load_state_dict(self, state: dict) -> None:
        self._last_lr = state["last_lr"]
