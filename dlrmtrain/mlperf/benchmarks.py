"""What the MLPerf rules require of each DLRM benchmark, as data.

Benchmark names (which one a config's family is logged as is its workload's,
`Workload.benchmark`), the layer names
`weights_initialization` must cover, the hyperparameter keys each ruleset
requires (with builders that fill them), the values each key can take at all,
and each benchmark's epoch numbering. The logger (logger.py) enforces these;
see its docstring for the timeline.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from mlperf_logging.mllog import constants as C

from dlrmtrain.config.schema import Division, SubmissionStatus, choices

DLRM = "dlrm"  # DLRM v1, MLPerf Training v0.7–v2.1 (mllog 4.x has no constant for it)
DLRM_DCNV2 = C.DLRM_DCNv2  # "dlrm_dcnv2": MLPerf Training v3.0–v6.0
DLRMV4 = C.DLRMV4  # "dlrmv4": HSTU on Yambda, MLPerf Training v6.1+
BENCHMARKS = (DLRM, DLRM_DCNV2, DLRMV4)


REFERENCE_DEFAULT_WIRE = {DLRMV4: "dedup+fp16"}
"""Benchmark → the dlrmtrain codec its reference's own wire equals. DLRMv4's gin turns on
TorchRec's index dedup (EC_INDEX_DEDUP, each rank's distinct rows) and fp16 quantized
comms: distinct rows rounded to fp16, i.e. `dedup+fp16`. (DCNv2's reference sends fp32.)"""
REFERENCE_DEFAULT_NAME = "reference default (index dedup + fp16, LOSSY)"


def display_label(benchmark: str, contender: str) -> str:
    """A contender (`--codecs` entry, `@<precision>` or not: contenders.py) as tables, plots
    and summaries name it on `benchmark`."""
    if REFERENCE_DEFAULT_WIRE.get(benchmark) == contender.partition("@")[0]:
        return f"{contender}: {REFERENCE_DEFAULT_NAME}"
    return contender


def mlperf_layer_names(benchmark: str, bottom_layers: int = 3, top_layers: int = 5,
                       cross_layers: int = 3) -> tuple[str, ...]:
    """The weights_initialization tensor names of a model with these layer counts.

    With MLPerf's counts (bottom 3, top 5, DCNv2 cross 3) this is exactly the list
    the dlrm END rule wants (closed_dlrm.yaml, 1.0.0+); DCNv2's rules name none,
    so its cross layers follow the same pattern.
    """
    if check_benchmark(benchmark) == DLRMV4:
        return ()  # neither dlrmv4's rules nor its reference log weights_initialization
    names = ["embeddings", *(f"bottom_mlp_dense{i}" for i in range(1, bottom_layers + 1)),
             *(f"top_mlp_dense{i}" for i in range(1, top_layers + 1))]
    if check_benchmark(benchmark) == DLRM_DCNV2:
        names += [f"dcn_cross_layer{i}" for i in range(1, cross_layers + 1)]
    return tuple(names)


LAYER_PATTERN = {DLRM: re.compile(r"embeddings|(bottom|top)_mlp_dense[1-9]\d*"),
                  DLRM_DCNV2: re.compile(r"embeddings|(bottom|top)_mlp_dense[1-9]\d*"
                                         r"|dcn_cross_layer[1-9]\d*")}

REQUIRED_HYPERPARAMETERS: dict[str, tuple[str, ...]] = {
    DLRM: (
        C.GLOBAL_BATCH_SIZE, C.GRADIENT_ACCUMULATION_STEPS, C.OPT_BASE_LR,
        C.OPT_LR_WARMUP_STEPS, "lr_decay_start_steps", "sgd_opt_base_learning_rate",
        "sgd_opt_learning_rate_decay_steps", "sgd_opt_learning_rate_decay_poly_power",
    ),
    DLRM_DCNV2: (
        C.GLOBAL_BATCH_SIZE, C.GRADIENT_ACCUMULATION_STEPS, C.OPT_NAME, C.OPT_BASE_LR,
        C.OPT_ADAGRAD_LR_DECAY, C.OPT_WEIGHT_DECAY, C.OPT_ADAGRAD_INITIAL_ACCUMULATOR_VALUE,
        C.OPT_ADAGRAD_EPSILON, C.OPT_LR_WARMUP_STEPS, C.OPT_LR_DECAY_START_STEP,
        C.OPT_LR_DECAY_STEPS,
    ),
    # The keys the dlrmv4 reference logs (mlcommons/training recommendation_v4, PR #889:
    # train/mlperf_logging_utils.py, MLPerfLogger.log_run_start), seed aside.
    DLRMV4: (
        C.GLOBAL_BATCH_SIZE, C.GRADIENT_ACCUMULATION_STEPS, C.OPT_NAME, C.OPT_BASE_LR,
        C.OPT_ADAM_BETA_1, C.OPT_ADAM_BETA_2, C.OPT_ADAM_EPSILON, C.OPT_WEIGHT_DECAY,
        C.OPT_GRADIENT_CLIP_NORM, C.OPT_LR_WARMUP_STEPS, C.OPT_LR_WARMUP_START_LR,
        C.OPT_SPARSE_NAME, C.OPT_SPARSE_BASE_LR, C.MAX_SEQUENCE_LENGTH,
        "eval_every_data_pct", "skip_eval_epoch_pct",
    ),
}
# Extra keys worth logging (the checker ignores keys it has no rule for).
OPTIONAL_HYPERPARAMETERS = (C.SEED, C.OPT_NAME)

# The run disclosure ruleset 6.1.0 requires of every benchmark (common.yaml, "v6.1+"):
# dlrmv4 is the only DLRM benchmark scored under it.
PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "fp8", "mxfp6", "nvfp4", "mxfp4", "bfloat16",
              "Graphcore FLOAT 16.16", "int8", "uint8", "int4", "uint4")
DISCLOSURE_KEYS = (
    C.LOWEST_NUMERICAL_PRECISION_IN_LINEAR, C.LOWEST_NUMERICAL_PRECISION_IN_ATTN,
    C.LOWEST_NUMERICAL_PRECISION_IN_COMM, C.TENSOR_PARALLELISM, C.PIPELINE_PARALLELISM,
    C.CONTEXT_PARALLELISM, C.EXPERT_PARALLELISM, C.MICRO_BATCH_SIZE, C.CONFIG_FILENAME)
NEEDS_DISCLOSURE = (DLRMV4,)

# epoch_num of "no training yet": DLRM v1 counts epochs from 1, DCNv2 and v4 from 0.
EPOCH_BASE = {DLRM: 1, DLRM_DCNV2: 0, DLRMV4: 0}
# Benchmarks whose progress metadata is samples_count (the rules check evals on a
# grid of samples): their logs mark blocks between evals, as their reference does.
COUNTS_SAMPLES = (DLRMV4,)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# What a value can be at all (whether the rules accept it is the checker's business).
_VALUE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    C.GLOBAL_BATCH_SIZE: (lambda v: _is_int(v) and v > 0, "a positive integer"),
    C.GRADIENT_ACCUMULATION_STEPS: (lambda v: _is_int(v) and v > 0, "a positive integer"),
    C.OPT_NAME: (lambda v: isinstance(v, str) and v != "", "a non-empty name"),
    C.OPT_SPARSE_NAME: (lambda v: isinstance(v, str) and v != "", "a non-empty name"),
    C.OPT_BASE_LR: (lambda v: _is_real(v) and v >= 0, "a finite number >= 0"),
    C.OPT_SPARSE_BASE_LR: (lambda v: _is_real(v) and v >= 0, "a finite number >= 0"),
    C.OPT_LR_WARMUP_START_LR: (lambda v: _is_real(v) and v >= 0, "a finite number >= 0"),
    C.OPT_LR_WARMUP_STEPS: (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    C.OPT_ADAM_BETA_1: (lambda v: _is_real(v) and 0 <= v < 1, "in [0, 1)"),
    C.OPT_ADAM_BETA_2: (lambda v: _is_real(v) and 0 <= v < 1, "in [0, 1)"),
    C.OPT_ADAM_EPSILON: (lambda v: _is_real(v) and v > 0, "a finite number > 0"),
    C.OPT_WEIGHT_DECAY: (lambda v: _is_real(v) and v >= 0, "a finite number >= 0"),
    C.OPT_GRADIENT_CLIP_NORM: (lambda v: _is_real(v) and v >= 0, "a finite number >= 0 (0: none)"),
    C.MAX_SEQUENCE_LENGTH: (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "eval_every_data_pct": (lambda v: _is_real(v) and 0 < v <= 1, "a fraction in (0, 1]"),
    "skip_eval_epoch_pct": (lambda v: _is_real(v) and 0 <= v < 1, "a fraction in [0, 1)"),
    C.SEED: (_is_int, "an integer"),
}


def check_hyperparameter_value(benchmark: str, key: str, value: Any) -> None:
    """Refuse a value no run could have (e.g. a beta of 1.5), naming the key."""
    check = _VALUE_CHECKS.get(key)
    if check is not None and not check[0](value):
        raise ValueError(f"MLPerf {benchmark} hyperparameter {key}={value!r}: must be {check[1]}")

DIVISIONS = choices(Division)
SUBMISSION_STATUSES = choices(SubmissionStatus)
RUN_STATUSES = (C.SUCCESS, C.ABORTED)


def dlrm_v1_hyperparameters(*, global_batch_size: int, learning_rate: float,
                            warmup_steps: int, decay_start_step: int, decay_steps: int,
                            gradient_accumulation_steps: int = 1,
                            seed: int | None = None) -> dict[str, Any]:
    """The ``dlrm`` ruleset's hyperparameter keys for SGD with warmup + poly-2 decay."""
    return _hyperparameters(global_batch_size, gradient_accumulation_steps, C.SGD, learning_rate, seed, {
        C.OPT_LR_WARMUP_STEPS: warmup_steps,
        # The v1 rules use the keys of the official hyperparameter table, not mllog's.
        "lr_decay_start_steps": decay_start_step,
        "sgd_opt_base_learning_rate": learning_rate,
        "sgd_opt_learning_rate_decay_steps": decay_steps,
        "sgd_opt_learning_rate_decay_poly_power": 2,
    })


def dcnv2_hyperparameters(*, global_batch_size: int, learning_rate: float,
                          epsilon: float = 1e-8, initial_accumulator_value: float = 0.0,
                          warmup_steps: int = 0, decay_start_step: int = 0,
                          decay_steps: int = 0, gradient_accumulation_steps: int = 1,
                          seed: int | None = None) -> dict[str, Any]:
    """The ``dlrm_dcnv2`` ruleset's hyperparameter keys for plain Adagrad."""
    return _hyperparameters(global_batch_size, gradient_accumulation_steps, C.ADAGRAD, learning_rate, seed, {
        C.OPT_ADAGRAD_LR_DECAY: 0.0,
        C.OPT_WEIGHT_DECAY: 0.0,
        C.OPT_ADAGRAD_INITIAL_ACCUMULATOR_VALUE: initial_accumulator_value,
        C.OPT_ADAGRAD_EPSILON: epsilon,
        C.OPT_LR_WARMUP_STEPS: warmup_steps,
        C.OPT_LR_DECAY_START_STEP: decay_start_step,
        C.OPT_LR_DECAY_STEPS: decay_steps,
    })


def dlrmv4_hyperparameters(*, global_batch_size: int, learning_rate: float, warmup_steps: int,
                           max_sequence_length: int, eval_every_data_pct: float,
                           skip_eval_epoch_pct: float,
                           adam_betas: tuple[float, float] = (0.95, 0.999),
                           adam_epsilon: float = 1e-8, weight_decay: float = 0.0,
                           gradient_clip_norm: float = 1.0, warmup_start_lr: float = 0.0,
                           sparse_name: str = "RowWiseAdagrad",
                           gradient_accumulation_steps: int = 1,
                           seed: int | None = None) -> dict[str, Any]:
    """The ``dlrmv4`` keys: dense Adam, sparse RowWiseAdagrad at the same rate, the
    linear warmup from `warmup_start_lr`, the sequence length and the eval schedule.

    Optimizer names are spelled as the rules check them (``Adam``, ``RowWiseAdagrad``).
    """
    beta_1, beta_2 = adam_betas
    return _hyperparameters(global_batch_size, gradient_accumulation_steps, "Adam", learning_rate, seed, {
        C.OPT_ADAM_BETA_1: float(beta_1),
        C.OPT_ADAM_BETA_2: float(beta_2),
        C.OPT_ADAM_EPSILON: float(adam_epsilon),
        C.OPT_WEIGHT_DECAY: float(weight_decay),
        C.OPT_GRADIENT_CLIP_NORM: float(gradient_clip_norm),
        C.OPT_LR_WARMUP_STEPS: warmup_steps,
        C.OPT_LR_WARMUP_START_LR: float(warmup_start_lr),
        C.OPT_SPARSE_NAME: sparse_name,
        # One learning rate for both: the reference ramps them in lockstep.
        C.OPT_SPARSE_BASE_LR: learning_rate,
        C.MAX_SEQUENCE_LENGTH: max_sequence_length,
        "eval_every_data_pct": float(eval_every_data_pct),
        "skip_eval_epoch_pct": float(skip_eval_epoch_pct),
    })


def _hyperparameters(global_batch_size: int, gradient_accumulation_steps: int, optimizer: str,
                     learning_rate: float, seed: int | None, ruleset_keys: dict[str, Any]) -> dict[str, Any]:
    """The keys every ruleset logs (the batch, the accumulation, the optimizer and its base rate),
    the ruleset's own keys after them, and the seed last where one is set."""
    hp: dict[str, Any] = {
        C.GLOBAL_BATCH_SIZE: global_batch_size,
        C.GRADIENT_ACCUMULATION_STEPS: gradient_accumulation_steps,
        C.OPT_NAME: optimizer,
        C.OPT_BASE_LR: learning_rate,
        **ruleset_keys,
    }
    if seed is not None:
        hp[C.SEED] = seed
    return hp


def check_benchmark(benchmark: str) -> str:
    check_choice("MLPerf benchmark", benchmark, BENCHMARKS)
    return benchmark


def check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}, got {value!r}")
