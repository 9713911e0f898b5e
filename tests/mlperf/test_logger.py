"""The MLPerf logger: rank handling, epoch_num conventions, and refusing bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlrmtrain.mlperf.compliance import check_log
from dlrmtrain.mlperf.benchmarks import (
    dcnv2_hyperparameters,
    dlrm_v1_hyperparameters,
    mlperf_layer_names,
)
from dlrmtrain.mlperf.logger import MLPerfLogger, NullMLPerfLogger, build_mlperf_logger
from dlrmtrain.mlperf.rules import DerivedRulesSpec
from dlrmtrain.mlperf.rules.derive import write_derived_rules
from tests.mlperf.simulated_run import EVAL_SAMPLES, SimulatedRun


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
