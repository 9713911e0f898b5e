"""The data sections in configs/data/ load, validate, and match what preprocessing produces."""

from __future__ import annotations

import pytest

from dlrmtrain.config import load_config
from dlrmtrain.validation import resolve_config, validate_config
from dlrmtrain.data import table_rows
from dlrmtrain.data.formats.binary import read_manifest
from dlrmtrain.features import MLPERF_DCNV2_MULTI_HOT_SIZES, MLPERF_DCNV2_TABLE_SIZES, MLPERF_V1_TABLE_SIZES
from dlrmtrain.data.preprocess.pipeline import preprocess
from dlrmtrain.data.synthetic.profiles import KAGGLE_SAMPLE_COLUMNS
from dlrmtrain.workloads import build_datasets
from tests.data.raw_rows import REPO_ROOT, shared_data_dir

CONFIGS = REPO_ROOT / "configs" / "data"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_data_config_loads_and_validates(name):
    cfg = load_config(CONFIGS / name)
    if cfg.data.source in ("synthetic_yambda", "yambda"):  # DLRMv4 data: validated under its model
        cfg = load_config(CONFIGS / name, ["model.arch=dlrmv4_hstu"])
    if cfg.data.source == "yambda" and not cfg.data.yambda.path:
        return  # the prepared dataset's path is given on the command line
    if cfg.data.source == "criteo" and cfg.data.table_sizes is None:
        return  # sizes from the dataset: validated on a prepared one below
    validate_config(cfg, 2)


def test_terabyte_configs_carry_the_mlperf_tables():
    v1 = load_config(CONFIGS / "criteo_terabyte.yaml").data
    dcn = load_config(CONFIGS / "criteo_terabyte_dcnv2.yaml").data
    assert (v1.source, v1.split, v1.table_sizes) == ("criteo", "mlperf", MLPERF_V1_TABLE_SIZES)
    assert dcn.table_sizes == MLPERF_DCNV2_TABLE_SIZES and dcn.multi_hot_sizes == MLPERF_DCNV2_MULTI_HOT_SIZES


def test_synthetic_config_uses_the_kaggle_profile():
    cfg = load_config(CONFIGS / "synthetic.yaml")
    assert table_rows(cfg) == [n for n, _ in KAGGLE_SAMPLE_COLUMNS]


def test_kaggle_sample_config_matches_its_preprocessing(tmp_path):
    sample = shared_data_dir() / "criteo_kaggle_sample.tsv.gz"
    if not sample.exists():
        pytest.skip(f"real Criteo sample not found at {sample} (set DLRMTRAIN_SHARED_DATA)")
    preprocess([sample], tmp_path / "prep", "mlperf_vocab", progress=False)
    cfg = load_config(CONFIGS / "criteo_kaggle_sample.yaml", [f"data.path={tmp_path / 'prep'}"])
    assert cfg.data.table_sizes is None   # taken from the dataset by resolve_config
    validate_config(cfg, 2)
    assert cfg.data.table_sizes is None   # validation only checks
    cfg = resolve_config(cfg)
    assert cfg.data.table_sizes == read_manifest(tmp_path / "prep")["table_sizes"]
    data = build_datasets(cfg, 0, 1)
    assert data.num_train_samples + data.num_eval_samples == 49_285
    assert data.num_eval_samples == round(49_285 * 0.1)
