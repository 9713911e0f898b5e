"""When a run ends, evaluates and checkpoints, counted in optimizer steps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from dlrmtrain.config.schema import Config
from dlrmtrain.run.errors import SetupError


def refuse_empty_epochs(train_samples: int, steps_per_epoch: int, global_batch_size: int,
                        world_size: int) -> None:
    """No full global batch means no step ever: stop now rather than loop over empty
    epochs (the same numbers on every rank, so every rank stops)."""
    if steps_per_epoch > 0:
        return
    gbs, world = global_batch_size, world_size
    raise SetupError(
        f"{train_samples} training rows do not fill one global batch of "
        f"{gbs} ({gbs // world} per rank × world size {world}): no training step can run. "
        f"Lower run.global_batch_size or use more training data.")


@dataclass
class Cadence:
    cfg: Config
    steps_per_epoch: int
    eval_grid: Optional[Any] = None
    """the benchmark's own eval steps (mlperf/eval_grid.py:EvalGrid); None: the eval section's"""

    @classmethod
    def of_epochs(cls, cfg: Config, steps_per_epoch: int, train_samples: int,
                  world_size: int) -> "Cadence":
        """The cadence of a run over epochs of `steps_per_epoch`; refused where no global
        batch fills one (refuse_empty_epochs)."""
        refuse_empty_epochs(train_samples, steps_per_epoch, cfg.run.global_batch_size, world_size)
        return cls(cfg, steps_per_epoch)

    def planned_steps(self) -> int:
        steps = math.floor(self.cfg.run.epochs * self.steps_per_epoch)
        if self.cfg.run.max_steps is not None:
            steps = min(steps, self.cfg.run.max_steps)
        return max(steps, 1)

    def eval_interval(self) -> int:
        per_epoch = self.cfg.eval.evals_per_epoch
        if not self.cfg.eval.enabled or per_epoch == 0:
            return 0
        return max(1, self.steps_per_epoch // per_epoch)

    def eval_due(self, step: int, last: bool) -> bool:
        """Whether the run evaluates after `step` (`last`: the planned last one)."""
        if self.eval_grid is not None:  # the benchmark's rules place every eval
            return self.cfg.eval.enabled and self.eval_grid.is_eval_step(step)
        interval = self.eval_interval()
        return self.cfg.eval.enabled and ((interval and step % interval == 0) or last)

    def checkpoint_due(self, step: int, finished: bool) -> bool:
        """Whether the run checkpoints after `step` (`finished`: it ends there)."""
        every = self.cfg.checkpoint.every_steps
        # at_end: also a run that stops early at its target AUC ends here
        return bool((every and step % every == 0) or (finished and self.cfg.checkpoint.at_end))
