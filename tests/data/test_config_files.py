"""The data sections in configs/data/ load, validate, and match what preprocessing produces."""

from __future__ import annotations

import pytest

from dlrmtrain.config import ConfigError, load_config
from dlrmtrain.validation import resolve_config, unresolved_keys, validate_config
from dlrmtrain.data.datasets import table_rows
from dlrmtrain.data.formats.binary import read_manifest
from dlrmtrain.features import MLPERF_DCNV2_MULTI_HOT_SIZES, MLPERF_DCNV2_TABLE_SIZES, MLPERF_V1_TABLE_SIZES
from dlrmtrain.data.preprocess.pipeline import preprocess
from dlrmtrain.data.synthetic.profiles import KAGGLE_SAMPLE_COLUMNS, terabyte_sizes
from dlrmtrain.workloads import build_datasets
from tests.data.raw_rows import REPO_ROOT, random_raw_lines, shared_data_dir, write_lines

CONFIGS = REPO_ROOT / "configs" / "data"


RESOLVED_TABLE_SIZES = {
    "criteo_terabyte.yaml": MLPERF_V1_TABLE_SIZES,
    "criteo_terabyte_dcnv2.yaml": MLPERF_DCNV2_TABLE_SIZES,
    "synthetic.yaml": [n for n, _ in KAGGLE_SAMPLE_COLUMNS],
    "synthetic_terabyte.yaml": terabyte_sizes("v1", scale=0.01),
}
"""The table sizes each DLRM data config resolves to (criteo_kaggle_sample.yaml's: its prepared
dataset's dataset.json)"""


@pytest.fixture(scope="module")
def prepared_criteo(tmp_path_factory):
    """A small Criteo dataset prepared as criteo_kaggle_sample.yaml's comment says (mlperf_vocab)."""
    tmp = tmp_path_factory.mktemp("kaggle_like")
    preprocess([write_lines(tmp / "sample.tsv", random_raw_lines(600, seed=5))], tmp / "prep",
               "mlperf_vocab", progress=False)
    return tmp / "prep"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_data_config_loads_and_validates(name, prepared_criteo, tmp_path):
    """Each data config validates as a user runs it (a DLRMv4 one under its model, with the path
    of its prepared dataset where it needs one) and resolves to the tables it says."""
    cfg = load_config(CONFIGS / name)
    given = []
    if cfg.data.source in ("synthetic_yambda", "yambda"):  # DLRMv4 data: validated under its model
        given.append("model.arch=dlrmv4_hstu")
    if cfg.data.source == "yambda" and not cfg.data.yambda.path:  # given on the command line
        with pytest.raises(ConfigError, match=r"^data\.yambda\.path: source 'yambda' needs the prepared"):
            validate_config(load_config(CONFIGS / name, given), 2)
        given.append(f"data.yambda.path={tmp_path}")
    if cfg.data.source == "criteo" and cfg.data.table_sizes is None:  # sizes from the dataset
        given.append(f"data.path={prepared_criteo}")
    cfg = load_config(CONFIGS / name, given)
    validate_config(cfg, 2)
    resolved = resolve_config(cfg)
    assert unresolved_keys(resolved) == []
    if cfg.data.source in ("synthetic_yambda", "yambda"):  # nothing of DLRMv4's data comes from elsewhere
        assert resolved.data == cfg.data
    elif name in RESOLVED_TABLE_SIZES:
        assert resolved.data.table_sizes == RESOLVED_TABLE_SIZES[name]
    else:
        assert cfg.data.table_sizes is None
        assert resolved.data.table_sizes == read_manifest(prepared_criteo)["table_sizes"]


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
