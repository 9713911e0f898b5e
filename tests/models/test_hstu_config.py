"""model.arch dlrmv4_hstu in the config: the shipped configs load and pass the model
checks; bad HSTU values are refused naming their key."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrmtrain.config import load_config
from dlrmtrain.config.checks import check_model
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.sequence_features import TABLES
from dlrmtrain.workloads import workload_of
from tests.models.hstu_batches import tiny_hstu_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["mlperf_dlrmv4.yaml", "mini_dlrmv4.yaml"])
def test_shipped_configs_load_and_pass_the_model_checks(name):
    cfg = load_config(CONFIGS / name)
    assert cfg.model.arch == "dlrmv4_hstu"
    check_model(cfg)
    workload_of(cfg).check_model(cfg)
    assert workload_of(cfg).table_names(cfg) == list(TABLES)


@pytest.mark.parametrize("override, key", [
    ("model.hstu.max_seq_len=9", "model.hstu.max_seq_len"),
    ("model.hstu.num_heads=0", "model.hstu.num_heads"),
    ("model.hstu.linear_dropout=1.0", "model.hstu.linear_dropout"),
    ("model.hstu.loss_weight=0", "model.hstu.loss_weight"),
    ("model.max_table_rows=0", "model.max_table_rows"),
])
def test_bad_hstu_values_are_refused_naming_the_key(override, key):
    cfg = tiny_hstu_config(override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_model(cfg)  # the shared model checks, then DLRMv4's own (as validate_config asks them)
        workload_of(cfg).check_model(cfg)


def test_unknown_hstu_keys_and_postprocessors_are_refused_by_the_loader():
    with pytest.raises(ConfigError, match="model.hstu.num_layer"):
        tiny_hstu_config("model.hstu.num_layer=2")
    with pytest.raises(ConfigError, match="model.hstu.postprocessor"):
        tiny_hstu_config("model.hstu.postprocessor=softmax")
