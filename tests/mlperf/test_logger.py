"""The MLPerf logger: rank handling, epoch_num conventions, and refusing bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlrmtrain.mlperf.compliance import check_log
from dlrmtrain.mlperf.benchmarks import (
    DISCLOSURE_KEYS,
    dcnv2_hyperparameters,
    dlrm_v1_hyperparameters,
    dlrmv4_hyperparameters,
    mlperf_layer_names,
)
from dlrmtrain.mlperf.eval_grid import eval_grid_for_config
from dlrmtrain.mlperf.logger import (
    MLPerfLogger,
    NullMLPerfLogger,
    build_mlperf_logger,
    comm_precision,
    log_run_setup,
)
from dlrmtrain.mlperf.rules import DerivedRulesSpec
from dlrmtrain.mlperf.rules.derive import write_derived_rules
from tests.mlperf.simulated_run import EVAL_SAMPLES, Dlrmv4Numbers, SimulatedRun, dlrmv4_config


def _events(log: Path) -> list[dict]:
    lines = log.read_text().splitlines()
    assert all(line.startswith(":::MLLOG ") for line in lines)
    return [json.loads(line[len(":::MLLOG "):]) for line in lines]


def _by_key(events: list[dict], key: str) -> list[dict]:
    return [e for e in events if e["key"] == key]


def test_only_rank_zero_with_a_path_writes(tmp_path):
    assert isinstance(build_mlperf_logger("dlrm", tmp_path / "r0.log", 0), MLPerfLogger)
    assert isinstance(build_mlperf_logger("dlrm", tmp_path / "r1.log", 1), NullMLPerfLogger)
    assert isinstance(build_mlperf_logger("dlrm", None, 0), NullMLPerfLogger)

    SimulatedRun("dlrm").write(tmp_path / "r1.log", rank=1)
    assert not (tmp_path / "r1.log").exists()
    SimulatedRun("dlrm").write(tmp_path / "r0.log", rank=0)
    assert len(_events(tmp_path / "r0.log")) > 30


def test_dlrm_counts_epochs_from_one_and_logs_blocks(tmp_path):
    events = _events(SimulatedRun("dlrm", aucs=(0.7, 0.8)).write(tmp_path / "l.log"))
    assert [e["metadata"]["epoch_num"] for e in _by_key(events, "eval_accuracy")] == [1.5, 2]
    [block] = _by_key(events, "block_start")
    assert (block["metadata"]["first_epoch_num"], block["metadata"]["epoch_count"]) == (1, 1)
    assert _by_key(events, "epoch_start")[0]["metadata"]["epoch_num"] == 1
    [stop] = _by_key(events, "run_stop")
    assert (stop["metadata"]["status"], stop["metadata"]["epoch_num"]) == ("success", 2)


def test_dcnv2_counts_epochs_from_zero_without_blocks(tmp_path):
    events = _events(SimulatedRun("dlrm_dcnv2", aucs=(0.7, 0.8)).write(tmp_path / "l.log"))
    assert [e["metadata"]["epoch_num"] for e in _by_key(events, "eval_accuracy")] == [0.5, 1]
    assert _by_key(events, "block_start") == []
    assert _by_key(events, "epoch_start")[0]["metadata"]["epoch_num"] == 0


@pytest.mark.parametrize("benchmark", ["dlrm", "dlrm_dcnv2"])
def test_every_mlperf_layer_and_required_key_is_logged_once(tmp_path, benchmark):
    events = _events(SimulatedRun(benchmark).write(tmp_path / "l.log"))
    tensors = [e["metadata"]["tensor"] for e in _by_key(events, "weights_initialization")]
    assert tensors == list(mlperf_layer_names(benchmark))
    for key in ("global_batch_size", "gradient_accumulation_steps", "opt_base_learning_rate",
                "train_samples", "eval_samples", "submission_division", "init_stop", "run_start"):
        assert len(_by_key(events, key)) == 1, key


def test_layer_names_follow_the_model_and_match_the_dlrm_rule_at_mlperf_size():
    assert mlperf_layer_names("dlrm") == (
        "embeddings", "bottom_mlp_dense1", "bottom_mlp_dense2", "bottom_mlp_dense3",
        "top_mlp_dense1", "top_mlp_dense2", "top_mlp_dense3", "top_mlp_dense4", "top_mlp_dense5")
    assert mlperf_layer_names("dlrm_dcnv2", 2, 3, 1) == (
        "embeddings", "bottom_mlp_dense1", "bottom_mlp_dense2",
        "top_mlp_dense1", "top_mlp_dense2", "top_mlp_dense3", "dcn_cross_layer1")


def test_log_lines_name_the_callers_file(tmp_path):
    events = _events(SimulatedRun("dlrm").write(tmp_path / "l.log"))
    files = {Path(e["metadata"]["file"]).name for e in events}
    assert files == {"simulated_run.py"}


@pytest.mark.parametrize("factory", [
    lambda p: build_mlperf_logger("dlrm", p, 0),
    lambda p: build_mlperf_logger("dlrm", p, 1),  # the stand-in refuses the same input
])
def test_bad_input_is_refused_on_every_rank(tmp_path, factory):
    logger = factory(tmp_path / "l.log")
    hp = dlrm_v1_hyperparameters(global_batch_size=8, learning_rate=1.0, warmup_steps=0,
                                 decay_start_step=0, decay_steps=0)
    with pytest.raises(ValueError, match="sgd_opt_base_learning_rate"):
        logger.hyperparameters({k: v for k, v in hp.items() if k != "sgd_opt_base_learning_rate"})
    with pytest.raises(ValueError, match="opt_base_learning_rat'"):
        logger.hyperparameters({**hp, "opt_base_learning_rat": 1.0})
    with pytest.raises(ValueError, match="dcn_cross_layer1"):
        logger.weights_initialization(["embeddings", "dcn_cross_layer1"])  # not a v1 layer
    with pytest.raises(ValueError, match="division"):
        logger.submission_info("org", "premier", "cpu", "research")
    with pytest.raises(RuntimeError, match="submission_info"):
        logger.init_stop()
    with pytest.raises(ValueError, match="run status"):
        logger.run_stop("done", 1.0)
    logger.eval_samples(100)
    logger.eval_samples(100)  # the same size again is fine (logged once)
    with pytest.raises(ValueError, match="eval_samples"):
        logger.eval_samples(101)
    with pytest.raises(ValueError, match="positive integer"):
        logger.train_samples(0)
    logger.close()


@pytest.mark.parametrize("benchmark,ruleset", [("dlrm", "2.1.0"), ("dlrm_dcnv2", "6.0.0")])
def test_run_stop_closes_an_epoch_left_open(tmp_path, benchmark, ruleset):
    # The rules want an epoch_stop (or block_stop); an early stop must still log one.
    run = SimulatedRun(benchmark, stop_inside_epoch=True, eval_samples=EVAL_SAMPLES)
    events = _events(run.write(tmp_path / "l.log"))
    keys = [e["key"] for e in events]
    assert keys.index("epoch_stop") < keys.index("run_stop")
    rules = write_derived_rules(DerivedRulesSpec(
        benchmark, ruleset, 0.75, EVAL_SAMPLES if benchmark == "dlrm_dcnv2" else None), tmp_path)
    assert check_log(tmp_path / "l.log", ruleset, rules).passed


def test_epochs_must_nest(tmp_path):
    logger = build_mlperf_logger("dlrm", tmp_path / "l.log", 0)
    logger.epoch_start(0)
    with pytest.raises(RuntimeError, match="epoch 0 is open"):
        logger.epoch_start(1)
    with pytest.raises(RuntimeError, match="open epoch is 0"):
        logger.epoch_stop(1)
    logger.close()


def test_unknown_benchmark_is_refused(tmp_path):
    with pytest.raises(ValueError, match="dlrm_dcnv2"):
        build_mlperf_logger("dlrmv3", tmp_path / "l.log", 0)


def test_dcnv2_hyperparameters_need_the_adagrad_keys(tmp_path):
    logger = build_mlperf_logger("dlrm_dcnv2", tmp_path / "l.log", 0)
    sgd = dlrm_v1_hyperparameters(global_batch_size=8, learning_rate=1.0, warmup_steps=0,
                                  decay_start_step=0, decay_steps=0)
    with pytest.raises(ValueError, match="opt_adagrad_epsilon"):
        logger.hyperparameters(sgd)
    logger.hyperparameters(dcnv2_hyperparameters(global_batch_size=8, learning_rate=0.1))
    logger.close()
    keys = {e["key"]: e["value"] for e in _events(tmp_path / "l.log")}
    assert keys["opt_name"] == "adagrad" and keys["opt_adagrad_epsilon"] == 1e-8


# ---- dlrmv4 ---------------------------------------------------------------------------

# The hyperparameter keys the reference logs (mlcommons/training recommendation_v4,
# PR #889: train/mlperf_logging_utils.py, MLPerfLogger.log_run_start).
REFERENCE_DLRMV4_KEYS = {
    "global_batch_size", "gradient_accumulation_steps", "seed", "opt_name",
    "opt_base_learning_rate", "opt_adam_beta_1", "opt_adam_beta_2", "opt_adam_epsilon",
    "opt_weight_decay", "opt_gradient_clip_norm", "opt_learning_rate_warmup_steps",
    "opt_learning_rate_warmup_start_lr", "opt_sparse_name", "opt_sparse_base_learning_rate",
    "max_sequence_length", "eval_every_data_pct", "skip_eval_epoch_pct"}
# What else a run logs before init_stop: the submission, the 6.1.0 disclosure, the sizes.
SETUP_KEYS = {"cache_clear", "init_start", "submission_benchmark", "submission_org",
              "submission_division", "submission_platform", "submission_status",
              "train_samples", "eval_samples", *DISCLOSURE_KEYS}


def test_dlrmv4_setup_logs_the_references_hyperparameters_from_the_config(tmp_path):
    events = _events(SimulatedRun("dlrmv4").write(tmp_path / "l.log"))
    keys = [e["key"] for e in events]
    setup = keys[:keys.index("init_stop")]
    assert set(setup) - SETUP_KEYS == REFERENCE_DLRMV4_KEYS
    assert len(setup) == len(set(setup))  # each once
    values = {e["key"]: e["value"] for e in events}
    n = Dlrmv4Numbers()
    assert values["submission_benchmark"] == "dlrmv4"
    assert (values["opt_name"], values["opt_sparse_name"]) == ("Adam", "RowWiseAdagrad")
    assert values["opt_base_learning_rate"] == values["opt_sparse_base_learning_rate"] == n.lr
    assert (values["opt_adam_beta_1"], values["opt_adam_beta_2"]) == (0.95, 0.999)
    assert values["opt_gradient_clip_norm"] == 1.0
    assert values["max_sequence_length"] == n.max_seq_len
    assert values["eval_every_data_pct"] == n.eval_every_data_pct
    assert values["skip_eval_epoch_pct"] == n.skip_eval_epoch_pct
    assert values["micro_batch_size"] == n.global_batch_size // n.world_size
    assert "weights_initialization" not in keys


def test_dlrmv4_marks_blocks_between_evals_on_the_grid(tmp_path):
    run = SimulatedRun("dlrmv4", aucs=(0.7, 0.72, 0.76))
    events = _events(run.write(tmp_path / "l.log"))
    timeline = [(e["key"], e["metadata"].get("samples_count")) for e in events
                if e["key"] in ("block_start", "block_stop", "eval_start", "eval_stop", "run_stop")]
    grid = eval_grid_for_config(dlrmv4_config(run.dlrmv4), run.dlrmv4.train_samples)
    first, step = grid.first_eval_samples, grid.interval_samples
    end = run.dlrmv4.train_samples // run.dlrmv4.global_batch_size * run.dlrmv4.global_batch_size
    assert timeline == [("block_start", 0)] + [
        item for s in (first, first + step, first + 2 * step)
        for item in (("block_stop", s), ("eval_start", s), ("eval_stop", s), ("block_start", s))
    ] + [("block_stop", end), ("run_stop", end)]
    assert _by_key(events, "epoch_start") == []
    accuracy = _by_key(events, "eval_accuracy")[0]["metadata"]
    assert accuracy["samples_count"] == first
    assert accuracy["epoch_num"] == pytest.approx(first / run.dlrmv4.train_samples, abs=1e-6)


def test_dlrmv4_early_stop_closes_the_block_at_run_stop(tmp_path):
    events = _events(SimulatedRun("dlrmv4", stop_inside_epoch=True).write(tmp_path / "l.log"))
    *_, block_stop, run_stop = events
    assert (block_stop["key"], run_stop["key"]) == ("block_stop", "run_stop")
    assert block_stop["metadata"]["samples_count"] == run_stop["metadata"]["samples_count"] \
        == _by_key(events, "eval_accuracy")[-1]["metadata"]["samples_count"]


@pytest.mark.parametrize("rank", [0, 1])  # the stand-in refuses the same input
def test_dlrmv4_bad_values_are_refused_naming_the_key(tmp_path, rank):
    logger = build_mlperf_logger("dlrmv4", tmp_path / "l.log", rank)
    hp = dlrmv4_hyperparameters(global_batch_size=256, learning_rate=1e-3, warmup_steps=50,
                                max_sequence_length=64, eval_every_data_pct=0.05,
                                skip_eval_epoch_pct=0.2)
    for key, bad in (("opt_adam_beta_1", 1.5), ("opt_adam_epsilon", 0.0),
                     ("max_sequence_length", 0), ("global_batch_size", 256.5),
                     ("eval_every_data_pct", 2.0), ("opt_gradient_clip_norm", float("nan"))):
        with pytest.raises(ValueError, match=f"{key}={bad!r}"):
            logger.hyperparameters({**hp, key: bad})
    with pytest.raises(ValueError, match="opt_sparse_base_learning_rate"):
        logger.hyperparameters({k: v for k, v in hp.items() if k != "opt_sparse_base_learning_rate"})
    with pytest.raises(ValueError, match="eval_start: dlrmv4 needs samples_count"):
        logger.eval_start(0.5)  # dlrmv4's rules check evals by samples_count
    with pytest.raises(ValueError, match="epoch_start: dlrmv4 needs samples_count"):
        logger.epoch_start(0)
    logger.epoch_start(0, samples_count=0)  # the refused call left no epoch open
    with pytest.raises(ValueError, match="lowest_numerical_precision_in_comm"):
        logger.run_disclosure(precision_linear="fp32", precision_attn="fp32", precision_comm="fp12",
                              micro_batch_size=128, config_filename="c.yaml")
    with pytest.raises(ValueError, match="weights_initialization"):
        logger.weights_initialization(["embeddings"])
    logger.submission_info("org", "closed", "cpu", "research")
    with pytest.raises(RuntimeError, match="run_disclosure"):
        logger.init_stop()
    logger.close()


def test_dlrmv4_setup_refuses_a_bad_config_value_naming_the_key(tmp_path):
    logger = build_mlperf_logger("dlrmv4", tmp_path / "l.log", 0)
    n = Dlrmv4Numbers()
    with pytest.raises(ValueError, match="opt_adam_beta_2=1.0"):
        log_run_setup(logger, dlrmv4_config(n, {"optim.adam_betas": [0.95, 1.0]}),
                      n.train_samples, n.eval_samples, world_size=2)
    with pytest.raises(ValueError, match="mlperf.eval_every_data_pct"):
        log_run_setup(logger, dlrmv4_config(n, {"mlperf.eval_every_data_pct": 0.0}),
                      n.train_samples, n.eval_samples, world_size=2)
    logger.close()


def test_dlrmv4_disclosure_follows_precision_and_codec():
    assert comm_precision("none") == comm_precision("dedup") == comm_precision("auto") == "fp32"
    assert comm_precision("dedup+fp16") == comm_precision("fp16") == "fp16"
    assert comm_precision("none", ["bf16"]) == "bfloat16"
    assert comm_precision("dedup+bf16", ["int8"]) == "int8"
