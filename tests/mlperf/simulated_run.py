"""A realistic MLPerf event timeline of a small run, driven through the real logger.

No model: the timeline is what the trainer logs for one epoch with two
evaluations. A settable clock makes run_start → run_stop durations exact, so
scoring tests know each run's time to train.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dlrmtrain.mlperf.benchmarks import DLRM, dcnv2_hyperparameters, dlrm_v1_hyperparameters
from dlrmtrain.mlperf.logger import build_mlperf_logger

EVAL_SAMPLES = 1024
TRAIN_SAMPLES = 8192


@dataclass
class ManualClock:
    """Milliseconds since the epoch, advanced by the test."""

    now_ms: float = 1.7e12

    def __call__(self) -> float:
        return self.now_ms


@dataclass
class SimulatedRun:
    benchmark: str
    aucs: tuple[float, ...] = (0.71, 0.76)
    """eval_accuracy values, evaluated at evenly spaced points of one epoch."""
    status: str = "success"
    run_minutes: float = 1.0
    eval_samples: int = EVAL_SAMPLES
    hyperparameter_overrides: dict = field(default_factory=dict)
    skip_weights: bool = False
    stop_inside_epoch: bool = False
    """Reach run_stop without epoch_stop, as a run that hits its target mid-epoch does."""

    def write(self, log_path: Path, rank: int = 0) -> Path:
        clock = ManualClock()
        logger = build_mlperf_logger(self.benchmark, log_path, rank, clock=clock)
        with logger:
            logger.cache_clear()
            logger.init_start()
            logger.submission_info("dlrmtrain", "closed", "cpu_2x_gloo", "research")
            logger.hyperparameters({**self._hyperparameters(), **self.hyperparameter_overrides})
            if not self.skip_weights:
                logger.weights_initialization()
            logger.train_samples(TRAIN_SAMPLES)
            logger.eval_samples(self.eval_samples)
            clock.now_ms += 5_000  # init (model build, sharding plan) takes a while
            logger.init_stop()
            logger.run_start()
            run_ms = self.run_minutes * 60_000
            logger.epoch_start(0)
            for i, auc in enumerate(self.aucs, start=1):
                epochs_done = i / len(self.aucs)
                clock.now_ms += run_ms / len(self.aucs)
                logger.eval_start(epochs_done)
                logger.eval_accuracy(auc, epochs_done)
                logger.eval_stop(epochs_done)
            if not self.stop_inside_epoch:
                logger.epoch_stop(0)
            logger.run_stop(self.status, 1.0)
        return log_path

    def _hyperparameters(self) -> dict:
        if self.benchmark == DLRM:
            return dlrm_v1_hyperparameters(global_batch_size=512, learning_rate=1.0, warmup_steps=4,
                                           decay_start_step=8, decay_steps=8, seed=7)
        return dcnv2_hyperparameters(global_batch_size=512, learning_rate=0.004, seed=7)
