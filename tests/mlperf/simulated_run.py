"""A realistic MLPerf event timeline of a small run, driven through the real logger.

No model: the timeline is what the trainer logs for one epoch with two
evaluations. A settable clock makes run_start → run_stop durations exact, so
scoring tests know each run's time to train.

dlrmv4 runs go through the trainer's own setup call, `log_run_setup`, on a
config sized by `Dlrmv4Numbers`, and evaluate on that config's `EvalGrid`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlrmtrain.config.schema import Config
from dlrmtrain.mlperf.benchmarks import DLRM, DLRMV4, dcnv2_hyperparameters, dlrm_v1_hyperparameters
from dlrmtrain.mlperf.eval_grid import eval_grid_for_config
from dlrmtrain.mlperf.logger import build_mlperf_logger, log_run_setup

EVAL_SAMPLES = 1024
TRAIN_SAMPLES = 8192


@dataclass(frozen=True)
class Dlrmv4Numbers:
    """What sizes a dlrmv4 run (the defaults: a small one)."""

    train_samples: int = 32768
    eval_samples: int = EVAL_SAMPLES
    global_batch_size: int = 256
    lr: float = 1e-3
    warmup_steps: int = 50
    max_seq_len: int = 64
    eval_every_data_pct: float = 0.05
    skip_eval_epoch_pct: float | None = 0.2
    world_size: int = 2


# The closed rules' numbers, at the reference's global batch 8192 on 8 ranks.
OFFICIAL_DLRMV4 = Dlrmv4Numbers(train_samples=2290835423, eval_samples=2058204,
                                global_batch_size=8192, lr=1e-6, warmup_steps=24000,
                                max_seq_len=4096, eval_every_data_pct=0.001,
                                skip_eval_epoch_pct=None, world_size=8)


def dlrmv4_config(n: Dlrmv4Numbers, changes: dict[str, Any] | None = None) -> Config:
    """A dlrmv4 run config of these numbers with the reference's optimizer, then
    `changes` ({"optim.adam_eps": 1e-6, ...}) applied."""
    cfg = Config()
    cfg.model.arch = "dlrmv4_hstu"
    cfg.model.hstu.max_seq_len = n.max_seq_len
    cfg.run.name, cfg.run.seed, cfg.run.global_batch_size = "sim_dlrmv4", 7, n.global_batch_size
    o = cfg.optim
    o.lr, o.warmup_steps = n.lr, n.warmup_steps
    # Set directly: the dlrmv4 optimizer fields are not in every schema this runs on.
    o.name, o.adam_betas, o.adam_eps, o.grad_clip_norm = "adam", [0.95, 0.999], 1e-8, 1.0
    cfg.mlperf.enabled, cfg.mlperf.platform = True, "cpu_2x_gloo"
    cfg.mlperf.eval_every_data_pct = n.eval_every_data_pct
    cfg.mlperf.skip_eval_epoch_pct = n.skip_eval_epoch_pct
    for dotted, value in (changes or {}).items():
        *path, last = dotted.split(".")
        section = cfg
        for name in path:
            section = getattr(section, name)
        setattr(section, last, value)
    return cfg


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
    dlrmv4: Dlrmv4Numbers = field(default_factory=Dlrmv4Numbers)
    config_changes: dict = field(default_factory=dict)
    """dlrmv4: config fields changed from `dlrmv4_config`'s (dotted names)."""
    eval_shift_steps: int = 0
    """dlrmv4: evaluate this many steps off the grid (negative: before it)."""
    config: Config | None = None
    """dlrmv4: log this run config instead of `dlrmv4_config(dlrmv4, config_changes)`
    (the sizes still come from `dlrmv4`)."""

    def write(self, log_path: Path, rank: int = 0) -> Path:
        clock = ManualClock()
        logger = build_mlperf_logger(self.benchmark, log_path, rank, clock=clock)
        if self.benchmark == DLRMV4:
            with logger:
                self._write_dlrmv4(logger, clock)
            return log_path
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

    def _write_dlrmv4(self, logger, clock: ManualClock) -> None:
        n = self.dlrmv4
        if self.eval_samples != EVAL_SAMPLES:
            n = replace(n, eval_samples=self.eval_samples)
        cfg = self.config or dlrmv4_config(n, self.config_changes)
        grid = eval_grid_for_config(cfg, n.train_samples)
        logger.cache_clear()
        logger.init_start()
        log_run_setup(logger, cfg, n.train_samples, n.eval_samples, world_size=n.world_size)
        clock.now_ms += 5_000
        logger.init_stop()
        logger.run_start()
        logger.epoch_start(0, samples_count=0)
        step = 0
        for i, auc in enumerate(self.aucs):
            step = grid.first_eval_step + i * grid.interval_steps + self.eval_shift_steps
            clock.now_ms += self.run_minutes * 60_000 / len(self.aucs)
            samples = grid.samples_count(step)
            epochs_done = samples / n.train_samples
            logger.eval_start(epochs_done, samples)
            logger.eval_accuracy(auc, epochs_done, samples)
            logger.eval_stop(epochs_done, samples)
        if not self.stop_inside_epoch:
            step = n.train_samples // cfg.run.global_batch_size  # the last full batch
            logger.epoch_stop(0, grid.samples_count(step))
        logger.run_stop(self.status, grid.samples_count(step) / n.train_samples,
                        grid.samples_count(step))

    def _hyperparameters(self) -> dict:
        if self.benchmark == DLRM:
            return dlrm_v1_hyperparameters(global_batch_size=512, learning_rate=1.0, warmup_steps=4,
                                           decay_start_step=8, decay_steps=8, seed=7)
        return dcnv2_hyperparameters(global_batch_size=512, learning_rate=0.004, seed=7)
