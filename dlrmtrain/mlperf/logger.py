"""MLPerf-compliant event log (``:::MLLOG`` lines) for the DLRM benchmarks.

A thin wrapper around ``mlperf_logging.mllog`` (pinned 4.1.68) that knows what
the compliance checker demands of ``dlrm`` (rulesets 0.7.0–2.1.0), of
``dlrm_dcnv2`` (ruleset 6.0.0) and of ``dlrmv4`` (ruleset 6.1.0), so the
trainer calls plain methods at its events and never writes ``if rank == 0``:

    logger = build_mlperf_logger("dlrm", run_dir / "mlperf.log", rank)

Rank 0 with a path gets an `MLPerfLogger` writing to that file; other ranks,
or a ``None`` path (MLPerf logging off), get a `NullMLPerfLogger`, which runs
the same argument checks and writes nothing. The trainer uses the config-level
pair: ``open_mlperf_logger(cfg, benchmark, rank)`` (``<run dir>/mlperf.log`` when
``mlperf.enabled``; the benchmark is the family's, ``Workload.benchmark``, handed in by the
trainer: the workloads sit above this package) and ``log_run_setup(...)`` (submission facts,
hyperparameters, layers, dataset sizes).

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

- ``dlrmv4``: global_batch_size, gradient_accumulation_steps, opt_name (``Adam``),
  opt_base_learning_rate (0.5–1.5 × 1e-6 × global batch / 8192), opt_adam_beta_1
  (0.95), opt_adam_beta_2 (0.999), opt_adam_epsilon (1e-8), opt_weight_decay (0),
  opt_gradient_clip_norm (1.0), opt_learning_rate_warmup_steps (24000),
  opt_learning_rate_warmup_start_lr (0), opt_sparse_name (``RowWiseAdagrad``),
  opt_sparse_base_learning_rate (= the dense one), max_sequence_length (4096),
  eval_every_data_pct (0.001) and skip_eval_epoch_pct (unchecked) — the set the
  reference logs (mlcommons/training recommendation_v4, PR #889); no
  weights_initialization; and before init_stop, `run_disclosure` (ruleset 6.1.0:
  lowest precision in linear / attention / communication, tensor, pipeline,
  context and expert parallelism, micro_batch_size, config_filename).

dlrmv4 differs in its progress: every epoch, eval and run_stop call also passes
``samples_count`` (global samples trained so far: step × global batch), which its
rules check evals by: an eval only at a global step on the grid of
`eval_grid.EvalGrid` (every ``interval_steps``, from ``first_eval_step``). The
logger marks blocks as its reference does — ``block_start`` at epoch_start and
after each eval, ``block_stop`` before each eval and at epoch_stop / run_stop —
and no epoch_start/stop::

    logger.epoch_start(0, 0)                     # block_start at samples 0 (resumed: k × batch)
    ... after global step k with grid.is_eval_step(k), n = k × global batch ...
    logger.eval_start(e, n); logger.eval_accuracy(auc, e, n); logger.eval_stop(e, n)
    logger.run_stop("success", e, n)

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

from dlrmtrain.mlperf.eval_grid import eval_grid_for_config
from dlrmtrain.mlperf.benchmarks import (
    COUNTS_SAMPLES,
    DISCLOSURE_KEYS,
    DIVISIONS,
    DLRM,
    DLRMV4,
    EPOCH_BASE,
    LAYER_PATTERN,
    NEEDS_DISCLOSURE,
    OPTIONAL_HYPERPARAMETERS,
    PRECISIONS,
    REQUIRED_HYPERPARAMETERS,
    RUN_STATUSES,
    SUBMISSION_STATUSES,
    check_benchmark,
    check_choice,
    check_hyperparameter_value,
    dcnv2_hyperparameters,
    dlrm_v1_hyperparameters,
    dlrmv4_hyperparameters,
    mlperf_layer_names,
)
from dlrmtrain.run.errors import SetupError
from dlrmtrain.run.records import StrictFileHandler

if TYPE_CHECKING:
    from dlrmtrain.config.schema import Config
    from dlrmtrain.mlperf.eval_grid import EvalGrid

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
        for key, value in mapping.items():
            check_hyperparameter_value(self.benchmark, key, value)
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
        if self.benchmark not in LAYER_PATTERN:
            raise ValueError(f"{self.benchmark} logs no weights_initialization (neither its rules "
                             "nor its reference do)")
        names = list(mlperf_layer_names(self.benchmark) if tensor_names is None else tensor_names)
        bad = [n for n in names if not LAYER_PATTERN[self.benchmark].fullmatch(n)]
        if bad:
            raise ValueError(f"{bad} are not {self.benchmark} layer names (e.g. "
                             f"{list(mlperf_layer_names(self.benchmark))})")
        for name in names:
            self._emit(C.WEIGHTS_INITIALIZATION, metadata={"tensor": name})

    def run_disclosure(self, *, precision_linear: str, precision_attn: str, precision_comm: str,
                       micro_batch_size: int, config_filename: str, tensor_parallelism: int = 1,
                       pipeline_parallelism: int = 1, context_parallelism: int = 1,
                       expert_parallelism: int = 1) -> None:
        """The precision, parallelism and run-config facts ruleset 6.1.0 requires (dlrmv4);
        log before init_stop(). Precisions are the lowest a linear layer, the attention and
        the communication use, in the rules' names (e.g. ``fp32``, ``bfloat16``)."""
        for what, value in (("linear", precision_linear), ("attn", precision_attn),
                            ("comm", precision_comm)):
            check_choice(f"lowest_numerical_precision_in_{what}", value, PRECISIONS)
        counts = {C.TENSOR_PARALLELISM: tensor_parallelism, C.PIPELINE_PARALLELISM:
                  pipeline_parallelism, C.CONTEXT_PARALLELISM: context_parallelism,
                  C.EXPERT_PARALLELISM: expert_parallelism, C.MICRO_BATCH_SIZE: micro_batch_size}
        for key, n in counts.items():
            _positive_int(key, n)
        if not config_filename:
            raise ValueError("config_filename must be non-empty")
        values = {C.LOWEST_NUMERICAL_PRECISION_IN_LINEAR: precision_linear,
                  C.LOWEST_NUMERICAL_PRECISION_IN_ATTN: precision_attn,
                  C.LOWEST_NUMERICAL_PRECISION_IN_COMM: precision_comm,
                  **{k: int(v) for k, v in counts.items()}, C.CONFIG_FILENAME: config_filename}
        for key in DISCLOSURE_KEYS:
            self._emit_once(key, values[key])
        self._disclosure_logged = True

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
        if self.benchmark in NEEDS_DISCLOSURE and not self._disclosure_logged:
            raise RuntimeError(f"call run_disclosure() before init_stop(): {self.benchmark}'s "
                               "ruleset requires precision, parallelism and config_filename")
        self._emit(C.INIT_STOP, kind="end")

    def run_start(self) -> None:
        self._emit(C.RUN_START, kind="start")

    def run_stop(self, status: str, epochs_done: float, samples_count: int | None = None) -> None:
        """End of the timed run; closes an epoch (or block) left open by an early stop."""
        check_choice("run status", status, RUN_STATUSES)
        progress = self._progress(epochs_done, samples_count, "run_stop")
        if self._open_epoch is not None:
            self._stop_epoch(self._open_epoch, progress)
        self._emit(C.RUN_STOP, kind="end", metadata={C.STATUS: status, **progress})

    def epoch_start(self, epoch: int, samples_count: int | None = None) -> None:
        """Start of 0-based training epoch `epoch` (and, for dlrm, its block; dlrmv4
        logs a block from `samples_count`, the global samples trained before it, instead:
        0 on a fresh run, step × global batch on a resumed one)."""
        if self._open_epoch is not None:
            raise RuntimeError(f"epoch_start({epoch}) while epoch {self._open_epoch} is open")
        if self.benchmark in COUNTS_SAMPLES:
            progress = self._progress(epoch, samples_count, "epoch_start")
            self._open_epoch = epoch
            self._start_block(progress)
            return
        self._open_epoch = epoch
        num = self.epoch_num(epoch)
        if self.benchmark == DLRM:
            self._emit(C.BLOCK_START, kind="start",
                       metadata={C.FIRST_EPOCH_NUM: num, C.EPOCH_COUNT: 1})
        self._emit(C.EPOCH_START, kind="start", metadata={C.EPOCH_NUM: num})

    def epoch_stop(self, epoch: int, samples_count: int | None = None) -> None:
        """End of epoch `epoch`; dlrmv4 needs the samples trained so far."""
        if self._open_epoch != epoch:
            raise RuntimeError(f"epoch_stop({epoch}) but the open epoch is {self._open_epoch}")
        self._stop_epoch(epoch, self._progress(epoch + 1, samples_count, "epoch_stop"))

    def eval_start(self, epochs_done: float, samples_count: int | None = None) -> None:
        """Start of an evaluation after `epochs_done` epochs (`samples_count`: the global
        samples trained so far, step × global batch; required by dlrmv4, whose block
        in progress it closes)."""
        progress = self._progress(epochs_done, samples_count, "eval_start")
        if self._open_block is not None:
            self._emit(C.BLOCK_STOP, kind="end", metadata=progress)
            self._open_block = None
        self._emit(C.EVAL_START, kind="start", metadata=progress)

    def eval_accuracy(self, value: float, epochs_done: float,
                      samples_count: int | None = None) -> None:
        """The evaluation's ROC AUC."""
        self._emit(C.EVAL_ACCURACY, float(value),
                   metadata=self._progress(epochs_done, samples_count, "eval_accuracy"))

    def eval_stop(self, epochs_done: float, samples_count: int | None = None) -> None:
        """End of an evaluation; dlrmv4 starts the next block of training here, as its
        reference does (run_stop closes it if the run ends instead)."""
        progress = self._progress(epochs_done, samples_count, "eval_stop")
        self._emit(C.EVAL_STOP, kind="end", metadata=progress)
        if self.benchmark in COUNTS_SAMPLES and self._open_epoch is not None:
            self._start_block(progress)

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
        self._disclosure_logged = False
        self._once: dict[str, Any] = {}
        self._open_epoch: int | None = None
        self._open_block: dict[str, Any] | None = None  # dlrmv4: the block's start progress

    def _progress(self, epochs_done: float, samples_count: int | None, event: str) -> dict[str, Any]:
        """The progress metadata of `event`: epoch_num, and for dlrmv4 samples_count
        (the key its rules check evals by; refused when missing)."""
        progress: dict[str, Any] = {C.EPOCH_NUM: self.epoch_num(epochs_done)}
        if samples_count is not None:
            if isinstance(samples_count, bool) or int(samples_count) != samples_count \
                    or samples_count < 0:
                raise ValueError(f"{event}: samples_count must be an integer >= 0, "
                                 f"got {samples_count!r}")
            progress = {C.SAMPLES_COUNT: int(samples_count), **progress}
        elif self.benchmark in COUNTS_SAMPLES:
            raise ValueError(f"{event}: {self.benchmark} needs samples_count (global samples "
                             "trained so far, step × global batch): its rules check evals by it")
        return progress

    def _start_block(self, progress: dict[str, Any]) -> None:
        self._emit(C.BLOCK_START, kind="start", metadata=progress, _depth=1)
        self._open_block = progress

    def _stop_epoch(self, epoch: int, progress: dict[str, Any]) -> None:
        if self.benchmark in COUNTS_SAMPLES:
            # dlrmv4 marks blocks (training between evals), not epochs.
            if self._open_block is not None:
                self._emit(C.BLOCK_STOP, kind="end", metadata=progress, _depth=1)
                self._open_block = None
            self._open_epoch = None
            return
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


def open_mlperf_logger(cfg: Config, benchmark: str, rank: int, append: bool = False) -> MLPerfLogger:
    """The trainer's logger of `benchmark` (the run's Workload.benchmark): `<run dir>/mlperf.log`
    on rank 0 when `mlperf.enabled` (`append`: a resumed run continues the log it started)."""
    path = Path(cfg.run.output_dir) / cfg.run.name / "mlperf.log" if cfg.mlperf.enabled else None
    return build_mlperf_logger(benchmark, path, rank, append=append)


def log_run_setup(logger: MLPerfLogger, cfg: Config, num_train_samples: int,
                  num_eval_samples: int, world_size: int | None = None) -> None:
    """Submission facts, hyperparameters, layers and dataset sizes, from the config
    (dlrmv4: also the run disclosure; `world_size` default: the process group's).

    Values are logged as configured, not as MLPerf wants them: the checker is
    what says whether e.g. a dlrm_dcnv2 run used plain Adagrad.
    """
    m, o = cfg.mlperf, cfg.optim
    logger.submission_info(m.org, m.division, m.platform, m.status)
    if logger.benchmark == DLRMV4:
        _log_dlrmv4_setup(logger, cfg, num_train_samples, world_size)
        logger.train_samples(num_train_samples)
        logger.eval_samples(num_eval_samples)
        return
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


def _log_dlrmv4_setup(logger: MLPerfLogger, cfg: Config, num_train_samples: int,
                      world_size: int | None) -> None:
    o = cfg.optim
    grid = eval_grid_for_config(cfg, num_train_samples)
    # The Adam fields come with the dlrmv4 optimizer (optim.name adam); until a config
    # has them, the reference's values stand in.
    clip = getattr(o, "grad_clip_norm", None)
    logger.hyperparameters({
        **dlrmv4_hyperparameters(
            global_batch_size=cfg.run.global_batch_size, learning_rate=o.lr,
            warmup_steps=o.warmup_steps, max_sequence_length=cfg.model.hstu.max_seq_len,
            eval_every_data_pct=cfg.mlperf.eval_every_data_pct,
            skip_eval_epoch_pct=grid.skip_eval_epoch_pct,
            adam_betas=tuple(getattr(o, "adam_betas", (0.95, 0.999))),
            adam_epsilon=getattr(o, "adam_eps", 1e-8),
            gradient_clip_norm=0.0 if clip is None else clip,  # the reference logs 0.0 for none
            sparse_name=SPARSE_OPTIMIZER.get(o.name, o.name), seed=cfg.run.seed),
        C.OPT_NAME: DENSE_OPTIMIZER.get(o.name, o.name)})
    if world_size is None:
        world_size = _process_group_size()
    if cfg.run.global_batch_size % world_size:
        raise ValueError(f"run.global_batch_size {cfg.run.global_batch_size} does not divide "
                         f"by {world_size} ranks")
    linear = PRECISION_OF_MODE[cfg.precision.mode]
    logger.run_disclosure(
        precision_linear=linear, precision_attn=linear,  # attention runs under the same autocast
        precision_comm=comm_precision(cfg.comm.codec, cfg.comm.table_codecs.values()),
        micro_batch_size=cfg.run.global_batch_size // world_size,
        config_filename=f"{cfg.run.name}/config.yaml")  # the resolved config every run writes


# Config optimizer names → the names the dlrmv4 rules check (opt_name, opt_sparse_name):
# `adam` is dense Adam with fused RowWiseAdagrad on the tables, as the reference.
DENSE_OPTIMIZER = {"adam": "Adam"}
SPARSE_OPTIMIZER = {"adam": "RowWiseAdagrad"}
PRECISION_OF_MODE = {"fp32": "fp32", "bf16": "bfloat16", "fp16": "fp16"}
# Embedding wire precision per codec (the dense all-reduce is fp32 under every codec).
_CODEC_PRECISION = {"fp16": "fp16", "dedup+fp16": "fp16", "bf16": "bfloat16",
                    "dedup+bf16": "bfloat16", "int8": "int8", "fp8": "fp8"}
_PRECISION_BITS = {"fp32": 32, "bfloat16": 16, "fp16": 16, "fp8": 8, "int8": 8}


def comm_precision(codec: str, table_codecs: Iterable[str] = ()) -> str:
    """The lowest precision any embedding all-to-all of the run uses (lossless codecs:
    fp32, the tables' own)."""
    names = [_CODEC_PRECISION.get(c, "fp32") for c in (codec, *table_codecs)]
    return min(names, key=lambda n: _PRECISION_BITS[n])


def _process_group_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _positive_int(what: str, n: int) -> int:
    if isinstance(n, bool) or int(n) != n or n <= 0:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return int(n)


def mlperf_eval_grid(cfg: Config, benchmark: str, train_samples: int) -> EvalGrid | None:
    """The steps a run logged for a benchmark that counts samples (dlrmv4) must evaluate
    at: its rules fix the grid (mlperf.eval_every_data_pct, skip_eval_epoch_pct), so
    eval.evals_per_epoch does not apply. None: evaluate as the eval section says."""
    if not (cfg.mlperf.enabled and benchmark in COUNTS_SAMPLES):
        return None
    try:
        return eval_grid_for_config(cfg, train_samples)
    except ValueError as e:
        raise SetupError(str(e)) from None
