"""Composing configs (a list of bases, `data=PRESET`), YAML numbers, and table sizes
taken from a prepared dataset's own metadata."""

from __future__ import annotations

import json

import pytest

from dlrmtrain.config import ConfigError, load_config
from dlrmtrain.validation import resolve_config, validate_config
from dlrmtrain.data.preprocess.pipeline import preprocess
from tests.data.raw_rows import REPO_ROOT, random_raw_lines, write_lines

HASH_SIZES = [7 + i for i in range(26)]


@pytest.mark.parametrize("text, value", [("1e-3", 1e-3), ("5E+2", 500.0), ("2.5e-1", 0.25),
                                         ("0.01", 0.01), ("3", 3.0)])
def test_scientific_numbers_are_numbers_in_files_and_overrides(tmp_path, text, value):
    assert load_config(None, [f"optim.lr={text}"]).optim.lr == value
    path = tmp_path / "c.yaml"
    path.write_text(f"optim:\n  lr: {text}\n")
    assert load_config(path).optim.lr == value


def test_a_negative_scientific_number_is_read_as_a_number():
    # Read as -0.25 (then refused as a negative rate), not as the string '-2.5e-1'.
    with pytest.raises(ConfigError, match="optim.lr: must not be negative, got -0.25"):
        load_config(None, ["optim.lr=-2.5e-1"])


def test_a_list_of_bases_merges_in_order_then_the_file(tmp_path):
    (tmp_path / "model.yaml").write_text("run:\n  seed: 1\nmodel:\n  embedding_dim: 8\n")
    (tmp_path / "data.yaml").write_text("run:\n  seed: 2\ndata:\n  source: criteo\n")
    (tmp_path / "both.yaml").write_text("base: [model.yaml, data.yaml]\noptim:\n  lr: 1e-2\n")
    cfg = load_config(tmp_path / "both.yaml")
    assert (cfg.run.seed, cfg.model.embedding_dim, cfg.data.source, cfg.optim.lr) == \
        (2, 8, "criteo", 0.01)
    (tmp_path / "bad.yaml").write_text("base: {a: 1}\n")
    with pytest.raises(ConfigError, match="base: expected a file name or a list"):
        load_config(tmp_path / "bad.yaml")


def test_data_preset_override_composes_the_terabyte_recipe():
    cfg = load_config(REPO_ROOT / "configs" / "mlperf_v1_terabyte.yaml",
                      ["data=criteo_terabyte", "data.path=/elsewhere"])
    assert (cfg.data.source, cfg.data.split, cfg.data.path) == ("criteo", "mlperf", "/elsewhere")
    assert cfg.optim.lr == 24.0                          # the model config's own sections stay
    with pytest.raises(ConfigError, match=r"no preset .*data/nosuch\.yaml \(known: .*criteo_terabyte"):
        load_config(REPO_ROOT / "configs" / "quickstart.yaml", ["data=nosuch"])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prep")
    raw = write_lines(tmp / "day_0", random_raw_lines(600, seed=3))
    preprocess([raw], tmp / "out", "hash", table_sizes=HASH_SIZES, progress=False)
    return tmp / "out"


def _criteo(path, *extra):
    return load_config(REPO_ROOT / "configs" / "quickstart.yaml",
                       ["data.source=criteo", f"data.path={path}", "data.split=fraction",
                        "data.eval_fraction=0.2", "run.global_batch_size=64",
                        "eval.batch_size=64", *extra])


def test_null_table_sizes_come_from_dataset_json(prepared):
    cfg = _criteo(prepared, "data.table_sizes=null")
    validate_config(cfg, 2)
    assert cfg.data.table_sizes is None  # checking changes nothing
    assert resolve_config(cfg).data.table_sizes == HASH_SIZES


def test_given_sizes_that_disagree_name_both(prepared):
    wrong = HASH_SIZES.copy()
    wrong[4] = 99
    cfg = _criteo(prepared, f"data.table_sizes={wrong}")
    with pytest.raises(ConfigError, match=rf"data\.table_sizes\[4\]: the config gives 99 but "
                                          rf"{prepared}/dataset\.json records 11"):
        validate_config(cfg, 2)
    validate_config(_criteo(prepared, f"data.table_sizes={HASH_SIZES}"), 2)  # agreeing: fine


def test_multi_hot_sizes_recorded_in_the_manifest_are_used(prepared, tmp_path):
    import shutil

    copy = tmp_path / "mh"
    shutil.copytree(prepared, copy)
    manifest = json.loads((copy / "dataset.json").read_text())
    manifest["multi_hot_sizes"] = [2] * 26
    (copy / "dataset.json").write_text(json.dumps(manifest))
    cfg = resolve_config(_criteo(copy, "data.table_sizes=null"))
    validate_config(cfg, 2)
    assert cfg.data.multi_hot_sizes == [2] * 26


def test_null_sizes_without_a_dataset_say_what_to_do(tmp_path):
    cfg = _criteo(tmp_path / "missing", "data.table_sizes=null")
    with pytest.raises(ConfigError, match=r"data\.table_sizes: null .* does not exist; prepare it"):
        validate_config(cfg, 2)
