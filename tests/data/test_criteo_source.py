"""Source `criteo` through the config: the trainer's build_datasets picks the file loader."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrmtrain.config.loader import ConfigError
from dlrmtrain.validation import validate_config
from dlrmtrain.data.datasets import table_rows
from dlrmtrain.data.preprocess.pipeline import preprocess
from dlrmtrain.workloads import build_datasets
from tests.common import tiny_config
from tests.data.raw_rows import random_raw_lines, write_lines
from tests.multiproc import run_ranks
from tests.multiproc.test_train_ranks import _train


def make_dataset(tmp_path, rows=(700, 500, 300)):
    paths = [write_lines(tmp_path / f"day_{i}", random_raw_lines(n, seed=40 + i)) for i, n in enumerate(rows)]
    summary = preprocess(paths, tmp_path / "prep", "mlperf_vocab", hash_range=5000, progress=False)
    return tmp_path / "prep", summary.table_sizes


def criteo_overrides(path, sizes, *extra):
    return ["data.source=criteo", f"data.path={path}", f"data.table_sizes={sizes}", "data.split=names",
            "data.train_parts=[day_0,day_1]", "data.eval_parts=[day_2]", *extra]


def test_build_datasets_selects_the_file_loader(tmp_path):
    path, sizes = make_dataset(tmp_path)
    cfg = tiny_config(str(tmp_path), *criteo_overrides(path, sizes))
    validate_config(cfg, 2)
    assert table_rows(cfg) == sizes
    per_rank = [build_datasets(cfg, rank, 2) for rank in range(2)]
    data = per_rank[0]
    assert (data.num_train_samples, data.num_eval_samples) == (1200, 300)
    assert data.steps_per_epoch == 1200 // 256
    batches = list(data.train_batches(0))
    assert len(batches) == 4 and all(b.labels.shape == (128,) for b in batches)
    eval_weights = [torch.cat([w for _, w in d.eval_batches()]) for d in per_rank]
    assert sum(float(w.sum()) for w in eval_weights) == 300  # every eval row once, padding weighs 0
    assert eval_weights[0].shape == eval_weights[1].shape


def test_model_smaller_than_vocabulary_folds_ids(tmp_path):
    path, sizes = make_dataset(tmp_path)
    cfg = tiny_config(str(tmp_path), *criteo_overrides(path, sizes, "model.max_table_rows=7"))
    batch = next(iter(build_datasets(cfg, 0, 1).train_batches(0)))
    assert int(batch.sparse_features.values().max()) < 7


def test_multi_hot_from_one_hot_files(tmp_path):
    path, sizes = make_dataset(tmp_path)
    bags = [1 + t % 3 for t in range(26)]
    cfg = tiny_config(str(tmp_path), *criteo_overrides(path, sizes, f"data.multi_hot_sizes={bags}"))
    batch = next(iter(build_datasets(cfg, 0, 1).train_batches(0)))
    for t in (0, 1, 2):
        assert torch.all(batch.sparse_features[f"cat_{t}"].lengths() == bags[t])


def test_too_small_table_sizes_are_refused(tmp_path):
    path, sizes = make_dataset(tmp_path)
    small = [max(1, s - 1) for s in sizes]
    cfg = tiny_config(str(tmp_path), *criteo_overrides(path, small))
    with pytest.raises(ValueError, match=r"data.table_sizes\[0\]"):
        build_datasets(cfg, 0, 1)


@pytest.mark.parametrize("override, message", [
    ("data.path=null", "data.path"),
    ("data.split=random", "data.split"),
    ("data.format=parquet", "data.format"),
])
def test_config_errors_name_the_key(tmp_path, override, message):
    # choices (split, format) are refused by the loader, the rest by validation
    with pytest.raises(ConfigError, match=message):
        cfg = tiny_config(str(tmp_path), *criteo_overrides(tmp_path, [10] * 26), override)
        validate_config(cfg, 1)


def test_two_ranks_train_on_preprocessed_files(tmp_path):
    path, sizes = make_dataset(tmp_path)
    overrides = criteo_overrides(path, sizes, "run.max_steps=3", "eval.evals_per_epoch=0")
    rank0, rank1 = run_ranks(_train, 2, str(tmp_path / "runs"), overrides, timeout=180)
    assert len(rank0["losses"]) == 3 and rank0["losses"] == rank1["losses"]
    assert np.isfinite(np.asarray(rank0["losses"], dtype=float)).all()
    assert rank0["final_auc"] is not None and rank0["final_auc"] == rank1["final_auc"]


@pytest.mark.parametrize("source", ["criteo", "synthetic"])
def test_train_batches_can_start_mid_epoch(tmp_path, source):
    """A resumed run asks for batches from its position on: the same batches as a
    full pass from there, without reading the skipped ones."""
    extra = ["data.shuffle_batches=true"]
    if source == "criteo":
        path, sizes = make_dataset(tmp_path)
        overrides = criteo_overrides(path, sizes, *extra)
    else:
        overrides = []
    data = build_datasets(tiny_config(str(tmp_path), *overrides), 0, 2)
    full = list(data.train_batches(1))
    tail = list(data.train_batches(1, 2))
    assert len(tail) == len(full) - 2
    for a, b in zip(full[2:], tail):
        assert torch.equal(a.dense_features, b.dense_features)
        assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
