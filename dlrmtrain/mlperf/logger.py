"""MLPerf-compliant event log (``:::MLLOG`` lines) for the DLRM benchmarks.

A thin wrapper around ``mlperf_logging.mllog`` (pinned 4.1.68) that knows what
the compliance checker demands of ``dlrm`` (rulesets 0.7.0–2.1.0) and of
``dlrm_dcnv2`` (ruleset 6.0.0), so the trainer calls plain methods at its
events and never writes ``if rank == 0``:

    logger = build_mlperf_logger("dlrm", run_dir / "mlperf.log", rank)

Rank 0 with a path gets an `MLPerfLogger` writing to that file; other ranks,
or a ``None`` path (MLPerf logging off), get a `NullMLPerfLogger`, which runs
the same argument checks and writes nothing. The trainer uses the config-level
pair: ``open_mlperf_logger(cfg, rank)`` (``<run dir>/mlperf.log`` when
``mlperf.enabled``; benchmark from ``model.arch``) and ``log_run_setup(...)``
(submission facts, hyperparameters, layers, dataset sizes).

Timeline the trainer follows (every call is required unless marked optional)::

    logger.cache_clear()
    logger.init_start()
    logger.submission_info(org, division, platform, status)  # before init_stop
    logger.hyperparameters(dlrm_v1_hyperparameters(...))     # or dcnv2_...
    logger.weights_initialization(names)   # every layer: mlperf_layer_names(...)
    logger.train_samples(n); logger.eval_samples(n)          # once each
    logger.init_stop()
    logger.run_start()
    for epoch in ...:                      # 0-based epoch index
        logger.epoch_start(epoch)
        ... at each evaluation, with e = epochs trained so far (float) ...
        logger.eval_start(e); logger.eval_accuracy(auc, e); logger.eval_stop(e)
        logger.epoch_stop(epoch)           # run_stop closes an epoch left open
    logger.run_stop("success" | "aborted", e)
    logger.close()

Progress arguments are always *epochs trained so far*, counted from 0
(``epoch + steps_done / steps_per_epoch``); the logger converts them to each
benchmark's ``epoch_num`` convention:

- ``dlrm`` (DLRM v1 reference, facebookresearch/dlrm): epochs are numbered
  from 1; an eval after fraction f of the first epoch has ``epoch_num 1 + f``
  (RCP "epochs to converge" ≈ 1.75). Each epoch is also a block:
  ``block_start(first_epoch_num=k+1, epoch_count=1)`` plus ``epoch_start(k+1)``.
- ``dlrm_dcnv2`` (torchrec_dlrm reference): epochs are numbered from 0; an
  eval after fraction f of the first epoch has ``epoch_num f`` (RCP ≈ 0.7).
  Only ``epoch_start/stop`` are logged, as the reference does.

Keys each ruleset requires (checked by `hyperparameters`; the facts live in
benchmarks.py):

- ``dlrm``: global_batch_size, gradient_accumulation_steps,
  opt_base_learning_rate, opt_learning_rate_warmup_steps,
  lr_decay_start_steps, sgd_opt_base_learning_rate,
  sgd_opt_learning_rate_decay_steps, sgd_opt_learning_rate_decay_poly_power
  (must be 2); weights_initialization for exactly
  `mlperf_layer_names("dlrm")` (embeddings, bottom_mlp_dense1-3, top_mlp_dense1-5).
- ``dlrm_dcnv2``: global_batch_size, gradient_accumulation_steps, opt_name
  (``adagrad``), opt_base_learning_rate, opt_adagrad_learning_rate_decay,
  opt_weight_decay, opt_adagrad_initial_accumulator_value (all 0),
  opt_adagrad_epsilon (1e-8), opt_learning_rate_warmup_steps,
  opt_learning_rate_decay_start_step, opt_learning_rate_decay_steps (all 0).

Timestamps are wall-clock milliseconds; the MLPerf score is
``run_stop - run_start``. Call a barrier before ``run_start``/``run_stop`` so
rank 0's clock marks the moment every rank got there (the reference does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlperf_logging.mllog import constants as C
from mlperf_logging.mllog import mllog

from dlrmtrain.mlperf.benchmarks import (
    DIVISIONS,
    DLRM,
    EPOCH_BASE,
    LAYER_PATTERN,
    OPTIONAL_HYPERPARAMETERS,
    REQUIRED_HYPERPARAMETERS,
    RUN_STATUSES,
    SUBMISSION_STATUSES,
    benchmark_for_arch,
    check_benchmark,
    check_choice,
    dcnv2_hyperparameters,
    dlrm_v1_hyperparameters,
    mlperf_layer_names,
)
from dlrmtrain.run.records import StrictFileHandler

if TYPE_CHECKING:
    from dlrmtrain.config.schema import Config

_REPO_ROOT = Path(__file__).resolve().parents[2]


class MLPerfLogger:
    """Writes one benchmark's MLPerf events to a log file (rank 0 only)."""

    def __init__(self, benchmark: str, log_path: Path | str,
                 clock: Callable[[], float] | None = None, append: bool = False) -> None:
        """`clock` returns milliseconds since the epoch (default: wall clock);
        `append`: a resumed run adds to its log instead of replacing it."""
        self.benchmark = check_benchmark(benchmark)
        self.log_path = Path(log_path)
        self._clock = clock or (lambda: time.time() * 1e3)
        self._init_state()
        self._py_logger, self._handler = self._open(self.log_path, append)
        # root_dir: log "file" as a path relative to the repository, not absolute.
        self._mllog = mllog.MLLogger(logger=self._py_logger, root_dir=str(_REPO_ROOT))

    # -- submission and hyperparameters -------------------------------------------------

    def submission_info(self, org: str, division: str, platform: str, status: str) -> None:
        """submission_{benchmark,org,division,platform,status}; log before init_stop()."""
        if not org or not platform:
            raise ValueError(f"submission org and platform must be non-empty, got {org!r}, {platform!r}")
        check_choice("submission division", division, DIVISIONS)
        check_choice("submission status", status, SUBMISSION_STATUSES)
        self._emit(C.SUBMISSION_BENCHMARK, self.benchmark)
        self._emit(C.SUBMISSION_ORG, org)
        self._emit(C.SUBMISSION_DIVISION, division)
        self._emit(C.SUBMISSION_PLATFORM, platform)
        self._emit(C.SUBMISSION_STATUS, status)
        self._submission_logged = True

    def hyperparameters(self, mapping: Mapping[str, Any]) -> None:
        """Log every key the benchmark's rules require (see the module docstring)."""
        required = REQUIRED_HYPERPARAMETERS[self.benchmark]
        missing = [k for k in required if k not in mapping]
        if missing:
            raise ValueError(f"MLPerf {self.benchmark} hyperparameters lack {missing}; "
                             f"required: {list(required)}")
        unknown = [k for k in mapping if k not in required and k not in OPTIONAL_HYPERPARAMETERS]
        if unknown:
            raise ValueError(f"unknown MLPerf {self.benchmark} hyperparameter keys {unknown}; "
                             f"allowed: {list(required) + list(OPTIONAL_HYPERPARAMETERS)}")
        for key, value in mapping.items():
            self._emit_once(key, value)

    def weights_initialization(self, tensor_names: Iterable[str] | None = None) -> None:
        """One event per initialized layer (default: MLPerf's full-size model).

        Pass `mlperf_layer_names(...)` of the actual model when its layer counts
        differ; dlrm's rules accept only the MLPerf counts (3 bottom, 5 top).
        """
        names = list(mlperf_layer_names(self.benchmark) if tensor_names is None else tensor_names)
        bad = [n for n in names if not LAYER_PATTERN[self.benchmark].fullmatch(n)]
        if bad:
            raise ValueError(f"{bad} are not {self.benchmark} layer names (e.g. "
                             f"{list(mlperf_layer_names(self.benchmark))})")
        for name in names:
            self._emit(C.WEIGHTS_INITIALIZATION, metadata={"tensor": name})

    def train_samples(self, n: int) -> None:
        """Training-set size (logged once; the rules want exactly one)."""
        self._emit_once(C.TRAIN_SAMPLES, _positive_int("train_samples", n))

    def eval_samples(self, n: int) -> None:
        """Evaluation-set size (logged once; dlrm_dcnv2's rules check its value)."""
        self._emit_once(C.EVAL_SAMPLES, _positive_int("eval_samples", n))

    # -- phases --------------------------------------------------------------------------

    def cache_clear(self) -> None:
        self._emit(C.CACHE_CLEAR, True)

    def init_start(self) -> None:
        self._emit(C.INIT_START, kind="start")

    def init_stop(self) -> None:
        # The checker's init-time limit is set by the division line: it must come first.
        if not self._submission_logged:
            raise RuntimeError("call submission_info() before init_stop(): the checker "
                               "derives the allowed init time from submission_division")
        self._emit(C.INIT_STOP, kind="end")

    def run_start(self) -> None:
        self._emit(C.RUN_START, kind="start")

    def run_stop(self, status: str, epochs_done: float) -> None:
        """End of the timed run; closes an epoch left open by an early stop."""
        check_choice("run status", status, RUN_STATUSES)
        if self._open_epoch is not None:
            self._stop_epoch(self._open_epoch)
        self._emit(C.RUN_STOP, kind="end", metadata={
            C.STATUS: status, C.EPOCH_NUM: self.epoch_num(epochs_done)})

    def epoch_start(self, epoch: int) -> None:
        """Start of 0-based training epoch `epoch` (and, for dlrm, its block)."""
        if self._open_epoch is not None:
            raise RuntimeError(f"epoch_start({epoch}) while epoch {self._open_epoch} is open")
        self._open_epoch = epoch
        num = self.epoch_num(epoch)
        if self.benchmark == DLRM:
            self._emit(C.BLOCK_START, kind="start",
                       metadata={C.FIRST_EPOCH_NUM: num, C.EPOCH_COUNT: 1})
        self._emit(C.EPOCH_START, kind="start", metadata={C.EPOCH_NUM: num})

    def epoch_stop(self, epoch: int) -> None:
        if self._open_epoch != epoch:
            raise RuntimeError(f"epoch_stop({epoch}) but the open epoch is {self._open_epoch}")
        self._stop_epoch(epoch)

    def eval_start(self, epochs_done: float) -> None:
        self._emit(C.EVAL_START, kind="start", metadata={C.EPOCH_NUM: self.epoch_num(epochs_done)})

    def eval_accuracy(self, value: float, epochs_done: float) -> None:
        """The evaluation's ROC AUC."""
        self._emit(C.EVAL_ACCURACY, float(value),
                   metadata={C.EPOCH_NUM: self.epoch_num(epochs_done)})

    def eval_stop(self, epochs_done: float) -> None:
        self._emit(C.EVAL_STOP, kind="end", metadata={C.EPOCH_NUM: self.epoch_num(epochs_done)})

    def epoch_num(self, epochs_done: float) -> float:
        """The benchmark's epoch_num for `epochs_done` epochs of training (0-based)."""
        if epochs_done < 0:
            raise ValueError(f"epochs_done must be >= 0, got {epochs_done}")
        num = EPOCH_BASE[self.benchmark] + epochs_done
        return int(num) if float(num).is_integer() else round(float(num), 6)

    def close(self) -> None:
        if self._handler is not None:
            self._py_logger.removeHandler(self._handler)
            self._handler.close()
            self._handler = None

    def __enter__(self) -> MLPerfLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _init_state(self) -> None:
        self._submission_logged = False
        self._once: dict[str, Any] = {}
        self._open_epoch: int | None = None

    def _stop_epoch(self, epoch: int) -> None:
        # The rules want at least one epoch_stop (or block_stop): a run that reaches
        # its target inside the first epoch still needs one, hence run_stop's call.
        num = self.epoch_num(epoch)
        self._emit(C.EPOCH_STOP, kind="end", metadata={C.EPOCH_NUM: num}, _depth=1)
        if self.benchmark == DLRM:
            self._emit(C.BLOCK_STOP, kind="end", metadata={C.FIRST_EPOCH_NUM: num}, _depth=1)
        self._open_epoch = None

    @staticmethod
    def _open(path: Path, append: bool) -> tuple[logging.Logger, logging.Handler | None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        # A private, unregistered logger: no propagation to the root, no global state.
        py_logger = logging.Logger(f"dlrmtrain.mlperf:{path}", level=logging.INFO)
        handler = StrictFileHandler(path, mode="a" if append else "w", encoding="utf-8")
        py_logger.addHandler(handler)
        return py_logger, handler

    def _emit_once(self, key: str, value: Any) -> None:
        # Keys the rules want EXACTLY_ONE of: repeat calls with the same value are
        # no-ops, a different value is a bug in the caller.
        if key in self._once:
            if self._once[key] != value:
                raise ValueError(f"MLPerf key {key!r} already logged as {self._once[key]!r}, "
                                 f"now {value!r}: it must be logged exactly once")
            return
        self._once[key] = value
        self._emit(key, value, _depth=1)

    def _emit(self, key: str, value: Any = None, *, kind: str = "event",
              metadata: dict[str, Any] | None = None, _depth: int = 0) -> None:
        write = {"event": self._mllog.event, "start": self._mllog.start,
                 "end": self._mllog.end}[kind]
        # mllog records its caller's file:line; skip event(), _emit(), any helper
        # (_depth) and our public method so the line names the trainer's call.
        write(key=key, value=value, metadata=metadata, time_ms=int(self._clock()),
              stack_offset=3 + _depth)


class NullMLPerfLogger(MLPerfLogger):
    """The stand-in for ranks that do not log: same checks, no output."""

    def __init__(self, benchmark: str) -> None:
        self.benchmark = check_benchmark(benchmark)
        self.log_path = None  # type: ignore[assignment]
        self._init_state()
        self._handler = None

    def _emit(self, key: str, value: Any = None, *, kind: str = "event",
              metadata: dict[str, Any] | None = None, _depth: int = 0) -> None:
        pass


def build_mlperf_logger(benchmark: str, log_path: Path | str | None, rank: int,
                        clock: Callable[[], float] | None = None,
                        append: bool = False) -> MLPerfLogger:
    """Rank 0 with a path writes `log_path`; every other case gets the stand-in."""
    if rank == 0 and log_path is not None:
        return MLPerfLogger(benchmark, log_path, clock=clock, append=append)
    return NullMLPerfLogger(benchmark)


def open_mlperf_logger(cfg: Config, rank: int, append: bool = False) -> MLPerfLogger:
    """The trainer's logger: `<run dir>/mlperf.log` on rank 0 when `mlperf.enabled`
    (`append`: a resumed run continues the log it started)."""
    path = Path(cfg.run.output_dir) / cfg.run.name / "mlperf.log" if cfg.mlperf.enabled else None
    return build_mlperf_logger(benchmark_for_arch(cfg.model.arch), path, rank, append=append)


def log_run_setup(logger: MLPerfLogger, cfg: Config, num_train_samples: int,
                  num_eval_samples: int) -> None:
    """Submission facts, hyperparameters, layers and dataset sizes, from the config.

    Values are logged as configured, not as MLPerf wants them: the checker is
    what says whether e.g. a dlrm_dcnv2 run used plain Adagrad.
    """
    m, o = cfg.mlperf, cfg.optim
    logger.submission_info(m.org, m.division, m.platform, m.status)
    common = dict(global_batch_size=cfg.run.global_batch_size, learning_rate=o.lr,
                  warmup_steps=o.warmup_steps, decay_start_step=o.decay_start_step,
                  decay_steps=o.decay_steps, seed=cfg.run.seed)
    if logger.benchmark == DLRM:
        hp = dlrm_v1_hyperparameters(**common)
    else:
        # torch's and fbgemm's Adagrad both start their accumulators at 0.
        hp = dcnv2_hyperparameters(**common, epsilon=o.adagrad_eps, initial_accumulator_value=0.0)
    logger.hyperparameters({**hp, C.OPT_NAME: o.name})
    logger.weights_initialization(mlperf_layer_names(
        logger.benchmark, len(cfg.model.bottom_mlp), len(cfg.model.top_mlp),
        cfg.model.dcn_num_layers))
    logger.train_samples(num_train_samples)
    logger.eval_samples(num_eval_samples)


def _positive_int(what: str, n: int) -> int:
    if isinstance(n, bool) or int(n) != n or n <= 0:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return int(n)
