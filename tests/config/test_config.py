"""Config loading: YAML → typed sections, overrides, and every error case."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dlrmtrain.config import ConfigError, load_config, parse_cli
from dlrmtrain.config.loader import dump_config
from dlrmtrain.validation import validate_config

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_are_mlperf_v1_shapes():
    cfg = load_config(None)
    assert cfg.model.bottom_mlp == [512, 256, 128]
    assert cfg.model.top_mlp == [1024, 1024, 512, 256, 1]
    assert cfg.comm.codec == "none"
    assert cfg.data.table_sizes is None     # synthetic, profile custom: 1000 rows each
    validate_config(cfg, 1)
    from dlrmtrain.validation import resolve_config

    assert resolve_config(cfg).data.table_sizes == [1000] * 26


def test_yaml_then_overrides_take_precedence(tmp_path):
    path = write(tmp_path, "run:\n  seed: 3\n  global_batch_size: 64\noptim:\n  lr: 0.5\n")
    cfg = load_config(path, ["optim.lr=2", "comm.codec=none", "sharding.tables={t_cat_1: row_wise}",
                             "data.synthetic.zipf_exponent=1.3", "run.max_steps=null"])
    assert (cfg.run.seed, cfg.run.global_batch_size) == (3, 64)
    assert cfg.optim.lr == 2.0 and isinstance(cfg.optim.lr, float)  # int accepted for float
    assert cfg.sharding.tables == {"t_cat_1": "row_wise"}
    assert cfg.data.synthetic.zipf_exponent == 1.3
    assert cfg.run.max_steps is None


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(None, ["run.seed=9", "model.max_table_rows=1000"])
    dump_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg


def test_every_shipped_config_loads_and_validates():
    for path in sorted((REPO / "configs").glob("**/*.yaml")):
        cfg = load_config(path)
        if cfg.data.source in ("synthetic_yambda", "yambda") and cfg.model.arch != "dlrmv4_hstu":
            cfg = load_config(path, ["model.arch=dlrmv4_hstu"])  # a data section (configs/data/) under its model
        if cfg.data.source == "yambda" and not cfg.data.yambda.path:
            # the prepared Yambda dataset is given on the command line: that is the only complaint
            with pytest.raises(ConfigError, match=r"data\.yambda\.path: source 'yambda' needs"):
                validate_config(cfg, world_size=2)
            continue
        if cfg.data.source == "criteo" and cfg.data.table_sizes is None \
                and not Path(cfg.data.path).is_dir():
            # sizes come from the prepared dataset, absent here: that is the only complaint
            with pytest.raises(ConfigError, match=r"data\.table_sizes: null .* prepare it first"):
                validate_config(cfg, world_size=2)
            continue
        validate_config(cfg, world_size=2)


@pytest.mark.parametrize("text, overrides, message", [
    ("run:\n  seeed: 1\n", [], r"unknown key run\.seeed"),
    ("runn:\n  seed: 1\n", [], r"unknown key runn"),
    ("", ["optim.learning_rate=1"], r"unknown key optim\.learning_rate"),
    ("run:\n  seed: one\n", [], r"run\.seed: expected an integer"),
    ("run:\n  seed: 1.5\n", [], r"run\.seed: expected an integer"),
    ("eval:\n  enabled: 1\n", [], r"eval\.enabled: expected true/false"),
    ("model:\n  bottom_mlp: 5\n", [], r"model\.bottom_mlp: expected a list"),
    ("model:\n  bottom_mlp: [1, x]\n", [], r"model\.bottom_mlp\[1\]: expected an integer"),
    ("run: 3\n", [], r"run: expected a mapping"),
    ("- a\n- b\n", [], r"top level must be a mapping"),
    ("run: [\n", [], r"not valid YAML"),
    ("", ["noequals"], r"expected section\.key=value"),
    ("", ["seed=1"], r"the key must be section\.key"),
    ("", ["run.seed=null"], r"run\.seed: null is not allowed"),
    ("", ["comm.codec=zstd"], r"comm\.codec: 'zstd' is not one of"),  # a checked name (schema.CodecName)
    ("", ["comm.table_codecs={t_cat_1: gz}"], r"comm\.table_codecs\.t_cat_1: 'gz' is not one of"),
])
def test_load_errors_name_the_key(tmp_path, text, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), overrides)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml does not exist"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("overrides, world_size, message", [
    (["run.global_batch_size=1000"], 3, r"run\.global_batch_size: 1000 does not divide .* world size 3"),
    (["eval.batch_size=1001"], 2, r"eval\.batch_size"),
    (["data.table_sizes=[10, 20]"], 2, r"data\.table_sizes: 2 tables given"),
    (["data.table_sizes=" + str([10] * 25 + [0])], 2, r"data\.table_sizes\[25\]"),
    (["comm.table_codecs={t_cat_99: none}"], 2, r"comm\.table_codecs\.t_cat_99: no such table"),
    (["sharding.tables={t_cat_26: row_wise}"], 2, r"sharding\.tables\.t_cat_26: no such table"),
    (["model.bottom_mlp=[64, 32]"], 2, r"model\.bottom_mlp: the last width must equal"),
    (["model.top_mlp=[64, 2]"], 2, r"model\.top_mlp: the last width must be 1"),
    (["optim.lr=0"], 2, r"optim\.lr: must be positive"),
    (["optim.name=adam", "optim.adam_betas=[0.9]"], 2, r"optim\.adam_betas: two decay rates"),
    (["optim.name=adam", "optim.adam_betas=[0.9, 1.0]"], 2, r"optim\.adam_betas: two decay rates"),
    (["optim.name=adam", "optim.adam_eps=0"], 2, r"optim\.adam_eps: must be positive"),
    (["optim.grad_clip_norm=0"], 2, r"optim\.grad_clip_norm: must be positive or null"),
    (["model.arch=dlrmv4_hstu"], 2, r"data\.source: 'synthetic' does not feed model\.arch 'dlrmv4_hstu'"),
    (["data.source=synthetic_yambda"], 2, r"data\.source: 'synthetic_yambda' does not feed model\.arch 'dlrm_v1'"),
    (["model.arch=dlrmv4_hstu", "data.source=synthetic_yambda", "model.max_table_rows=1000"], 2,
     r"model\.max_table_rows: the Yambda sources size every table from the data"),
    (["run.pipeline=fused_sparse_dist", "run.device=cuda"], 2,
     r"run\.pipeline: fused_sparse_dist runs on CPU only: .* side stream .* use run\.pipeline=sparse_dist"),
    (["model.arch=dlrmv4_hstu", "data.source=synthetic_yambda", "model.hstu.max_seq_len=64"], 2,
     r"data\.yambda\.max_seq_len: 4096 exceeds model\.hstu\.max_seq_len 64"),
    (["run.ddp_bucket_mb=0"], 2, r"run\.ddp_bucket_mb: must be positive"),
    (["data.multi_hot_sizes=[1, 2]"], 2, r"data\.multi_hot_sizes: 2 entries for 26 tables"),
    (["eval.target_auc=1.5"], 2, r"eval\.target_auc"),
    (["sharding.table_ranks={t_cat_0: 2}"], 2, r"sharding\.table_ranks\.t_cat_0: rank 2 is outside"),
    (["sharding.table_ranks={t_cat_0: 1}", "sharding.tables={t_cat_0: row_wise}"], 2,
     r"only table-wise tables"),
    (["sharding.planner=torchrec", "sharding.tables={t_cat_0: row_wise}", "run.device=cpu"], 2,
     r"no row-wise sharding on CPU"),
    (["data.synthetic.num_train_samples=10"], 2, r"data\.synthetic\.num_train_samples"),
    (["data.workers=0"], 2, r"data\.workers: must be at least 1"),
    (["data.workers=2"], 2, r"data\.workers: 2 workers, but source 'synthetic' holds its rows in memory"),
    (["model.arch=dlrmv4_hstu", "data.source=synthetic_yambda", "data.workers=2",
      "data.yambda.prefetch_batches=0"], 2,
     r"data\.workers: 2 workers make batches ahead, but data\.yambda\.prefetch_batches is 0"),
    (["checkpoint.resume=true", "run.overwrite=true"], 2,  # was: the overwrite silently dropped
     r"^checkpoint\.resume=true and run\.overwrite=true: .*give one of them$"),
    # bf16 rows rounded again (precision.py): refused where the lookup emits bf16
    (["precision.mode=bf16", "comm.codec=dedup+fp16"], 2,
     r"comm\.codec: 'dedup\+fp16' under precision\.mode=bf16 would round rows twice"),
    (["precision.mode=bf16", "comm.codec=fp16"], 2, r"comm\.codec: 'fp16' under precision\.mode=bf16"),
    (["precision.mode=bf16", "comm.codec=dedup", "comm.table_codecs={t_cat_2: dedup+bf16}"], 2,
     r"comm\.table_codecs\.t_cat_2: 'dedup\+bf16' under precision\.mode=bf16"),
])
def test_validation_errors_name_the_key(overrides, world_size, message):
    cfg = load_config(None, overrides)
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg, world_size)


def test_dlrmv4_rows_stay_fp32_under_bf16_so_its_reference_wire_rounds_once():
    """DLRMv4's tables emit fp32 under bf16 (the reference's): `dedup+fp16` rounds the fp32 sum once."""
    from dlrmtrain.workloads import workload_of

    cfg = load_config(Path(__file__).parents[2] / "configs" / "mini_dlrmv4.yaml",
                      ["precision.mode=bf16", "comm.codec=dedup+fp16"])
    validate_config(cfg, 2)
    assert workload_of(cfg).table_precision(cfg) == "fp32"
    dlrm = load_config(None, ["precision.mode=bf16"])
    assert workload_of(dlrm).table_precision(dlrm) == "bf16"


# Choice fields are Literal types in the schema: the loader refuses other values,
# naming the key and the allowed values (or why a value is refused).
@pytest.mark.parametrize("overrides, message", [
    (["sharding.default_type=diagonal"], r"sharding\.default_type: 'diagonal'"),
    (["sharding.tables={t_cat_3: diagonal}"], r"sharding\.tables\.t_cat_3: 'diagonal'"),
    (["model.arch=transformer"], r"model\.arch"),
    (["optim.name=lamb"], r"optim\.name"),
    (["precision.mode=fp64"], r"precision\.mode"),
    (["precision.mode=fp16"], r"precision\.mode: fp16 is not supported.*use bf16"),
    (["run.device=tpu"], r"run\.device"),
    (["sharding.planner=magic"], r"sharding\.planner"),
    (["data.format=parquet"], r"data\.format: 'parquet' is not one of auto, dlrmtrain"),
    (["data.split=random"], r"data\.split"),
    (["data.synthetic.profile=avazu"], r"data\.synthetic\.profile"),
    (["mlperf.division=premier"], r"mlperf\.division: 'premier' is not one of closed, open"),
    (["run.pipeline=semi_sync"], r"run\.pipeline: semi_sync is not supported: .*one step stale"),
    (["run.pipeline=fused"], r"run\.pipeline: 'fused' is not one of off, sparse_dist, fused_sparse_dist"),
    (["run.pipeline=1"], r"run\.pipeline: 1 is not one of"),  # an alias of true is not
])
def test_choices_are_checked_by_the_loader(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize("value, mode", [("false", "off"), ("off", "off"), ("true", "sparse_dist"),
                                         ("sparse_dist", "sparse_dist"),
                                         ("fused_sparse_dist", "fused_sparse_dist")])
def test_pipeline_true_and_false_keep_their_meaning(tmp_path, value, mode):
    cfg = load_config(write(tmp_path, f"run:\n  pipeline: {value}\n"))
    assert cfg.run.pipeline == mode
    validate_config(cfg, 2)
    dump_config(cfg, tmp_path / "resolved.yaml")  # written as the choice's name, read back the same
    assert load_config(tmp_path / "resolved.yaml").run.pipeline == mode


def test_config_package_imports_nothing_above_it():
    """config/ is the bottom layer: loading and checking a config must not pull in
    data, comm, precision or torch (validation.py runs the higher packages' rules)."""
    code = ("import sys, dlrmtrain.config, dlrmtrain.config.checks; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('dlrmtrain', 'torch')))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120, cwd=REPO).stdout.split()
    assert set(loaded) <= {"dlrmtrain", "dlrmtrain.config", "dlrmtrain.config.checks",
                           "dlrmtrain.config.loader", "dlrmtrain.config.schema",
                           "dlrmtrain.features",
                           "dlrmtrain.known_warnings"}, loaded  # a leaf: imports only `warnings`


def test_cli_parsing():
    assert parse_cli(["--config", "a.yaml", "run.seed=1"]) == ("a.yaml", ["run.seed=1"])
    assert parse_cli(["--config=b.yaml"]) == ("b.yaml", [])
    with pytest.raises(ConfigError, match="unknown option --lr"):
        parse_cli(["--lr", "3"])


def test_entry_point_rejects_bad_config_before_starting_ranks(tmp_path):
    """A bad key fails fast with exit code 2 and one clear line, no process group."""
    proc = subprocess.run(
        [sys.executable, "-m", "dlrmtrain.train", "--config", str(REPO / "configs/quickstart.yaml"),
         "run.global_batch_size=1001"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
        env={"WORLD_SIZE": "2", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "config error" in proc.stderr and "run.global_batch_size" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_base_file_is_merged_under_the_variant(tmp_path):
    (tmp_path / "base.yaml").write_text("run:\n  seed: 4\n  name: base\noptim:\n  lr: 3\n")
    (tmp_path / "variant.yaml").write_text("base: base.yaml\nrun:\n  name: variant\n")
    cfg = load_config(tmp_path / "variant.yaml", ["optim.lr=5"])
    assert (cfg.run.seed, cfg.run.name, cfg.optim.lr) == (4, "variant", 5.0)
    amp = load_config(REPO / "configs/mlperf_v1_terabyte_bf16.yaml")
    assert amp.precision.mode == "bf16" and amp.optim.lr == 24.0


def test_base_loop_and_missing_base_are_errors(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml does not exist"):
        load_config(tmp_path / "c.yaml")


@pytest.mark.parametrize("text, line, key", [
    ("run: {name: a, name: b}\n", 1, "name"),
    ("run:\n  name: a\n  seed: 1\n  name: b\n", 4, "name"),
    ("run:\n  name: a\noptim:\n  lr: 0.1\nrun:\n  seed: 2\n", 5, "run"),
])
def test_a_key_given_twice_is_an_error_naming_file_line_and_key(tmp_path, text, line, key):
    """PyYAML keeps the last of two equal keys silently: `run: {name: a, name: b}` ran as b."""
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).startswith(f"{path}:{line}: key '{key}' given twice")


def test_a_key_given_twice_in_an_override_is_an_error():
    with pytest.raises(ConfigError, match=r"override run: key 'name' given twice"):
        load_config(None, ["run={name: a, name: b}"])


def test_validation_checks_without_changing_the_config_and_resolve_fills_in():
    """`validate_config` used to fill null table sizes in as it checked."""
    from dlrmtrain.validation import resolve_config, unresolved_keys

    cfg = load_config(None, ["data.synthetic.profile=kaggle", "run.global_batch_size=256"])
    assert unresolved_keys(cfg) == ["data.table_sizes", "comm.dedup_at"]
    validate_config(cfg, 2)
    assert cfg.data.table_sizes is None
    resolved = resolve_config(cfg)
    assert cfg.data.table_sizes is None and len(resolved.data.table_sizes) == 26
    assert unresolved_keys(resolved) == []


def test_the_trainer_reads_run_pipeline_resolved_and_refuses_auto(tmp_path):
    """`resolve_config` resolves `run.pipeline: auto` (and an unset comm.dedup_at) once; the Trainer refuses it unresolved
    (as it does null table sizes) before it touches the run directory or the device."""
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config
    from tests.common import tiny_overrides

    cfg = load_config(None, tiny_overrides(str(tmp_path)))
    assert cfg.run.pipeline == "auto" and resolve_config(cfg).run.pipeline in ("off", "sparse_dist")
    with pytest.raises(ValueError, match=r"resolve_config.*comm\.dedup_at, run\.pipeline still to resolve"):
        Trainer(cfg, env=None)
    assert not any(tmp_path.iterdir())


def test_resume_with_overwrite_is_refused_by_the_launcher_before_anything_is_written(tmp_path, capsys):
    """Issue 34: `checkpoint.resume=true run.overwrite=true` resumed and silently dropped
    the overwrite. `dlrmtrain train` refuses it: exit 2, one line naming both keys."""
    from dlrmtrain.cli import main

    out = tmp_path / "runs"
    rc = main(["train", "--config", str(REPO / "configs" / "quickstart.yaml"),
               f"run.output_dir={out}", "checkpoint.resume=true", "run.overwrite=true"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith("config error: checkpoint.resume=true and run.overwrite=true"), err
    assert not out.exists() and not any(tmp_path.iterdir())
