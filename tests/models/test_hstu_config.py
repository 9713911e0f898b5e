"""model.arch dlrmv4_hstu in the config: the shipped configs load and pass the model
checks; bad HSTU values are refused naming their key."""

from __future__ import annotations

import dataclasses
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


# ---- 0 silent drops: every config key is either used by the DLRMv4 path or refused ----

USED_BY_DLRMV4 = (
    "run.", "model.arch", "model.embedding_dim", "model.max_table_rows", "model.hstu.",
    "data.source", "data.workers", "data.yambda.", "sharding.", "comm.", "optim.", "precision.", "eval.",
    "checkpoint.", "logging.", "mlperf.",
)
"""Key prefixes the DLRMv4 path acts on (one with a refused value: comm.hierarchy node,
below; eval.evals_per_epoch is replaced by the benchmark's
eval grid under mlperf.enabled, as its docstring says)."""


def _leaf_keys(obj, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        keys += _leaf_keys(value, key + ".") if dataclasses.is_dataclass(value) else [key]
    return keys


def _other_value(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return [*value, 7]
    if isinstance(value, str):
        return value + "_other"
    return [3] if value is None else None


def test_every_config_key_is_used_by_dlrmv4_or_refused():
    from dlrmtrain.workloads.dlrmv4 import UNUSED_BY_DLRMV4
    from dlrmtrain.config.schema import Config

    keys = _leaf_keys(Config())
    unclassified = [k for k in keys if not k.startswith(USED_BY_DLRMV4)
                    and not any(k == u or k.startswith(u + ".") for u in UNUSED_BY_DLRMV4)]
    assert unclassified == []  # a new key must say whether DLRMv4 acts on it
    for key in UNUSED_BY_DLRMV4:
        cfg = tiny_hstu_config()
        *path, last = key.split(".")
        section = cfg
        for name in path:
            section = getattr(section, name)
        value = getattr(section, last)
        setattr(section, last, dataclasses.replace(value, scale=2.0) if dataclasses.is_dataclass(value)
                else _other_value(value))
        with pytest.raises(ConfigError, match=rf"^{key}: does not apply to model.arch dlrmv4_hstu"):
            workload_of(cfg).check_model(cfg)  # DLRMv4's own model checks (config/checks.check_hstu_model)


@pytest.mark.parametrize("override, key", [("comm.hierarchy=node", "comm.hierarchy")])
def test_settings_the_dlrmv4_path_cannot_honour_are_refused_naming_the_key(override, key):
    from dlrmtrain.validation import validate_config

    cfg = load_config(CONFIGS / "mini_dlrmv4.yaml", [override])
    with pytest.raises(ConfigError, match=rf"^{key}: "):
        validate_config(cfg, world_size=2)


@pytest.mark.parametrize("overrides, key", [
    (["comm.codec=auto", "comm.table_codecs={uid: dedup}"], "comm.table_codecs.uid"),
    (["comm.codec=dedup+fp16"], "comm.dedup_at: source needs comm.codec: dedup or auto"),
    (["comm.codec=dedup", "comm.table_codecs={uid: none}"], "comm.table_codecs.uid"),
])
def test_dedup_at_source_refuses_what_it_does_not_build_naming_the_key(overrides, key):
    from dlrmtrain.validation import validate_config

    cfg = load_config(CONFIGS / "mini_dlrmv4.yaml", ["comm.dedup_at=source", *overrides])
    with pytest.raises(ConfigError, match=key):
        validate_config(cfg, world_size=2)
    for codec in ("dedup", "auto"):  # `auto` at the source: none or the loader's distinct ids per step
        validate_config(load_config(CONFIGS / "mini_dlrmv4.yaml", ["comm.dedup_at=source", f"comm.codec={codec}"]), 2)


# ---- data_parallel: one table read once per sample, at most ----

@pytest.mark.parametrize("overrides, key, tables", [
    (["sharding.tables.item_id=data_parallel"], "sharding.tables.item_id",
     "table item_id (features item_id, item_candidate_id): fbgemm's dense CPU lookup sums"),
    (["comm.codec=dedup", "comm.dedup_at=source", "run.pipeline=sparse_dist",
      "sharding.tables={uid: data_parallel, album_id: data_parallel}"], "sharding.tables.album_id",
     "table album_id (features album_id, item_candidate_album_id): fbgemm's dense CPU lookup sums"),
    (["sharding.default_type=data_parallel", "sharding.tables={item_id: row_wise}"], "sharding.default_type",
     "tables artist_id (features artist_id, item_candidate_artist_id), "
     "album_id (features album_id, item_candidate_album_id): fbgemm's"),
    (["sharding.tables={uid: data_parallel, user_x_artist: data_parallel}"], "sharding.tables.user_x_artist",
     "table user_x_artist (features user_x_artist): TorchRec looks every replicated table up in one"),
], ids=["item_id", "album_id beside uid at the source pipelined", "default_type", "two read once per sample"])
def test_data_parallel_tables_the_dense_cpu_lookup_gets_wrong_are_refused_naming_the_key(overrides, key, tables):
    """fbgemm's dense CPU lookup pools, sample-major: with a history table (one id per past event)
    the run failed in TorchRec's construct_jagged_tensors (split_with_sizes) under every codec and
    pipeline; with two replicated features it trained on each other's rows (step 1's loss off)."""
    from dlrmtrain.validation import validate_config

    with pytest.raises(ConfigError) as refused:
        validate_config(load_config(CONFIGS / "mini_dlrmv4.yaml", overrides), world_size=2)
    message = str(refused.value)
    assert message.startswith(f"{key}: data_parallel cannot serve DLRMv4's {tables}"), message
    assert "\n" not in message and message.endswith("table_wise, row_wise or column_wise")


@pytest.mark.parametrize("overrides, table", [
    (["sharding.tables.uid=data_parallel"], "uid"),
    (["sharding.default_type=table_wise", "sharding.tables.user_x_hour=data_parallel"], "user_x_hour"),
])
def test_one_data_parallel_table_read_once_per_sample_is_taken(overrides, table):
    from dlrmtrain.distributed.sharding_checks import table_sharding_types
    from dlrmtrain.validation import resolve_config, validate_config

    cfg = load_config(CONFIGS / "mini_dlrmv4.yaml", overrides)
    validate_config(cfg, world_size=2)
    resolved = resolve_config(cfg)
    types = table_sharding_types(resolved.sharding, workload_of(resolved).table_names(resolved))
    assert set(types) == set(TABLES)
    assert {t for t, kind in types.items() if kind == "data_parallel"} == {table}  # that one alone
    assert all(kind == resolved.sharding.default_type for t, kind in types.items() if t != table)


def test_the_launcher_refuses_a_data_parallel_history_table_in_one_line(tmp_path, capsys):
    from dlrmtrain.cli import main

    out = tmp_path / "runs"
    rc = main(["train", "--config", str(CONFIGS / "mini_dlrmv4.yaml"), "--nproc", "2",
               f"run.output_dir={out}", "sharding.tables.item_id=data_parallel", "comm.codec=none"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("config error: sharding.tables.item_id: data_parallel cannot serve"), err
    assert not out.exists()
