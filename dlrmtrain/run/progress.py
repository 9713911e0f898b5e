"""The state a run carries from step to step, and what it did (the closing summary)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from tqdm import tqdm

from dlrmtrain.config.schema import Config
from dlrmtrain.run.console import codec_label
from dlrmtrain.run.peers import note_step, stalled_seconds


@dataclass
class EvalResult:
    step: int
    epoch: float
    auc: float
    num_samples: int
    seconds: float


@dataclass
class Summary:
    """What a run did; printed at the end and written to summary.json."""

    world_size: int
    codec: str = "none"
    """comm.codec, with per-table overrides: `dedup (t_cat_3: none)`"""
    steps: int = 0
    samples: int = 0
    train_seconds: float = 0.0
    """Wall time less evaluations, checkpoints and stalls: what the throughput divides by."""
    wall_seconds: float = 0.0
    stalled_seconds: float = 0.0
    """Time in which a rank was silent past run.stall_warn_s (run/peers.py): the job waited."""
    target_auc: Optional[float] = None
    time_to_target_s: Optional[float] = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)

    @classmethod
    def of_run(cls, cfg: Config, world_size: int) -> "Summary":
        """The summary of a run of `cfg` on `world_size` ranks, before its first step."""
        return cls(world_size=world_size, target_auc=cfg.eval.target_auc,
                   codec=codec_label(cfg.comm.codec, cfg.comm.table_codecs))

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.train_seconds if self.train_seconds else 0.0

    @property
    def final_auc(self) -> Optional[float]:
        return self.evals[-1].auc if self.evals else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size, "codec": self.codec, "steps": self.steps,
            "samples": self.samples,
            "train_seconds": self.train_seconds, "wall_seconds": self.wall_seconds,
            "stalled_seconds": self.stalled_seconds,
            "samples_per_second": self.samples_per_second, "final_auc": self.final_auc,
            "target_auc": self.target_auc, "reached_target": self.time_to_target_s is not None,
            "time_to_target_s": self.time_to_target_s,
            "evals": [vars(e) for e in self.evals],
            "losses": self.losses,
        }

    def render(self) -> str:
        auc = f"{self.final_auc:.4f}" if self.final_auc is not None else "n/a (eval off)"
        if self.target_auc is None:
            target = "no target set"
        elif self.time_to_target_s is not None:
            target = f"reached {self.target_auc} after {self.time_to_target_s:.1f} s"
        else:
            target = f"NOT reached ({self.target_auc})"
        return "\n".join([
            "=" * 60,
            "dlrmtrain run summary",
            f"  ranks            {self.world_size}",
            f"  codec            {self.codec}",
            f"  steps            {self.steps}  ({self.samples:,} samples)",
            f"  throughput       {self.samples_per_second:,.0f} samples/s "
            f"(training time {self.train_seconds:.1f} s, wall {self.wall_seconds:.1f} s)",
            *([f"  stalled          {self.stalled_seconds:.1f} s with a rank silent "
               f"(not in the training time)"] if self.stalled_seconds else []),
            f"  final eval AUC   {auc}",
            f"  target AUC       {target}",
            "=" * 60,
        ])


@dataclass
class RunProgress:
    """The state `Trainer.train` carries from step to step."""

    total: int               # the step to stop at
    first_step: int          # the step this process started from (after a resume)
    bar: Any                 # the tqdm progress bar
    summary: Summary
    window_loss: torch.Tensor  # sum of local losses since the last metrics line
    window_steps: int = 0
    start: float = field(default_factory=time.perf_counter)
    window_start: float = field(default_factory=time.perf_counter)
    paused: float = 0.0      # seconds spent in evaluation and checkpoints
    completed: int = 0       # the last step whose loss was recorded (a step that broke off is not)
    clock_running: bool = False  # the MLPerf clock: run_start logged, run_stop not yet
    last: bool = False       # this step is the planned last one

    @classmethod
    def begin(cls, total: int, first_step: int, summary: Summary, device: torch.device,
              show_bar: bool) -> "RunProgress":
        """A run from `first_step` to `total`, its progress bar shown where `show_bar`."""
        bar = tqdm(total=total, initial=min(first_step, total), desc="train", unit="step",
                   dynamic_ncols=True, disable=not show_bar)
        return cls(total=total, first_step=first_step, completed=first_step, bar=bar, summary=summary,
                   window_loss=torch.zeros((), device=device))

    def count(self, step: int, loss: torch.Tensor) -> None:
        """`step` is done: its local loss joins the metrics window, and the heartbeat's
        thread says this rank is at it (run/peers.py)."""
        self.window_loss += loss
        self.window_steps += 1
        self.completed = step
        self.bar.update(1)
        self.last = step >= self.total
        note_step(step)

    def new_window(self) -> None:
        self.window_loss.zero_()
        self.window_steps = 0

    def end_pause(self, pause_start: float) -> None:
        now = time.perf_counter()  # a stall within the pause is counted once, as a stall
        self.paused += now - pause_start - stalled_seconds(pause_start, now)
        if self.window_steps == 0:  # a new metrics window starts after the pause
            self.window_start = time.perf_counter()

    def window_seconds(self) -> float:
        """Seconds since the metrics window began, less a stall in it (the rate's divisor)."""
        now = time.perf_counter()
        return max(now - self.window_start - stalled_seconds(self.window_start, now), 1e-9)

    def stalled_seconds(self) -> float:
        """Seconds since the run's start in which a rank was silent (run/peers.py)."""
        return stalled_seconds(self.start, time.perf_counter())

    def closed_summary(self, step: int, global_batch_size: int) -> Summary:
        """The summary of the run ended after `step`: its steps, samples and times."""
        summary = self.summary
        summary.steps = step
        summary.samples = (step - self.first_step) * global_batch_size
        summary.wall_seconds = time.perf_counter() - self.start
        summary.stalled_seconds = self.stalled_seconds()
        summary.train_seconds = summary.wall_seconds - self.paused - summary.stalled_seconds
        return summary

    @property
    def finished(self) -> bool:
        return self.last or self.summary.time_to_target_s is not None
