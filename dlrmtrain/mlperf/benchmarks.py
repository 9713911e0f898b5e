"""What the MLPerf rules require of each DLRM benchmark, as data.

Benchmark names, which config `model.arch` maps to which, the layer names
`weights_initialization` must cover, the hyperparameter keys each ruleset
requires (with builders that fill them), and each benchmark's epoch numbering.
The logger (logger.py) enforces these; see its docstring for the timeline.
"""

from __future__ import annotations

import re
from typing import Any

from mlperf_logging.mllog import constants as C

from dlrmtrain.config.schema import Division, SubmissionStatus, choices

DLRM = "dlrm"  # DLRM v1, MLPerf Training v0.7–v2.1 (mllog 4.x has no constant for it)
DLRM_DCNV2 = C.DLRM_DCNv2  # "dlrm_dcnv2": MLPerf Training v3.0+
BENCHMARKS = (DLRM, DLRM_DCNV2)
# model.arch in the run config → MLPerf benchmark name.
_BENCHMARK_OF_ARCH = {"dlrm_v1": DLRM, "dlrm_dcnv2": DLRM_DCNV2}


def mlperf_layer_names(benchmark: str, bottom_layers: int = 3, top_layers: int = 5,
                       cross_layers: int = 3) -> tuple[str, ...]:
    """The weights_initialization tensor names of a model with these layer counts.

    With MLPerf's counts (bottom 3, top 5, DCNv2 cross 3) this is exactly the list
    the dlrm END rule wants (closed_dlrm.yaml, 1.0.0+); DCNv2's rules name none,
    so its cross layers follow the same pattern.
    """
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
}
# Extra keys worth logging (the checker ignores keys it has no rule for).
OPTIONAL_HYPERPARAMETERS = (C.SEED, C.OPT_NAME)

# epoch_num of "no training yet": DLRM v1 counts epochs from 1, DCNv2 from 0.
EPOCH_BASE = {DLRM: 1, DLRM_DCNV2: 0}

DIVISIONS = choices(Division)
SUBMISSION_STATUSES = choices(SubmissionStatus)
RUN_STATUSES = (C.SUCCESS, C.ABORTED)


def dlrm_v1_hyperparameters(*, global_batch_size: int, learning_rate: float,
                            warmup_steps: int, decay_start_step: int, decay_steps: int,
                            gradient_accumulation_steps: int = 1,
                            seed: int | None = None) -> dict[str, Any]:
    """The ``dlrm`` ruleset's hyperparameter keys for SGD with warmup + poly-2 decay."""
    hp: dict[str, Any] = {
        C.GLOBAL_BATCH_SIZE: global_batch_size,
        C.GRADIENT_ACCUMULATION_STEPS: gradient_accumulation_steps,
        C.OPT_NAME: C.SGD,
        C.OPT_BASE_LR: learning_rate,
        C.OPT_LR_WARMUP_STEPS: warmup_steps,
        # The v1 rules use the keys of the official hyperparameter table, not mllog's.
        "lr_decay_start_steps": decay_start_step,
        "sgd_opt_base_learning_rate": learning_rate,
        "sgd_opt_learning_rate_decay_steps": decay_steps,
        "sgd_opt_learning_rate_decay_poly_power": 2,
    }
    if seed is not None:
        hp[C.SEED] = seed
    return hp


def dcnv2_hyperparameters(*, global_batch_size: int, learning_rate: float,
                          epsilon: float = 1e-8, initial_accumulator_value: float = 0.0,
                          warmup_steps: int = 0, decay_start_step: int = 0,
                          decay_steps: int = 0, gradient_accumulation_steps: int = 1,
                          seed: int | None = None) -> dict[str, Any]:
    """The ``dlrm_dcnv2`` ruleset's hyperparameter keys for plain Adagrad."""
    hp: dict[str, Any] = {
        C.GLOBAL_BATCH_SIZE: global_batch_size,
        C.GRADIENT_ACCUMULATION_STEPS: gradient_accumulation_steps,
        C.OPT_NAME: C.ADAGRAD,
        C.OPT_BASE_LR: learning_rate,
        C.OPT_ADAGRAD_LR_DECAY: 0.0,
        C.OPT_WEIGHT_DECAY: 0.0,
        C.OPT_ADAGRAD_INITIAL_ACCUMULATOR_VALUE: initial_accumulator_value,
        C.OPT_ADAGRAD_EPSILON: epsilon,
        C.OPT_LR_WARMUP_STEPS: warmup_steps,
        C.OPT_LR_DECAY_START_STEP: decay_start_step,
        C.OPT_LR_DECAY_STEPS: decay_steps,
    }
    if seed is not None:
        hp[C.SEED] = seed
    return hp


def benchmark_for_arch(arch: str) -> str:
    """The MLPerf benchmark a model architecture (config `model.arch`) is scored under."""
    if arch not in _BENCHMARK_OF_ARCH:
        raise ValueError(f"model.arch {arch!r} has no MLPerf benchmark; "
                         f"known: {sorted(_BENCHMARK_OF_ARCH)}")
    return _BENCHMARK_OF_ARCH[arch]


def check_benchmark(benchmark: str) -> str:
    check_choice("MLPerf benchmark", benchmark, BENCHMARKS)
    return benchmark


def check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}, got {value!r}")
