"""Readers for TorchRec .npy, TorchRec/MLPerf multi-hot .npz and facebookresearch .bin, on files written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
from dlrmtrain.data.sources import detect_format, open_parts
from dlrmtrain.data.splits import mlperf_split

rng = np.random.default_rng(0)


def write_torchrec_day(d, day, rows):
    dense = rng.random((rows, 13), dtype=np.float32)
    sparse = rng.integers(0, 1000, (rows, 26)).astype(np.int32)
    labels = rng.integers(0, 2, (rows, 1)).astype(np.int32)
    np.save(d / f"day_{day}_dense.npy", dense)
    np.save(d / f"day_{day}_sparse.npy", sparse)
    np.save(d / f"day_{day}_labels.npy", labels)
    return dense, sparse, labels


def collect(parts, batch=16):
    out = list(CriteoBatchLoader(parts, CriteoLoaderSpec(batch, last_batch="partial", prefetch=0)))
    return out


def test_torchrec_npy_days(tmp_path):
    days = [write_torchrec_day(tmp_path, d, rows) for d, rows in enumerate([20, 11])]
    assert detect_format(tmp_path) == "torchrec"
    parts = open_parts(tmp_path)
    assert [p.name for p in parts] == ["day_0", "day_1"]
    batches = collect(parts)
    dense = torch.cat([b.dense_features for b in batches]).numpy()
    labels = torch.cat([b.labels for b in batches]).numpy()
    np.testing.assert_array_equal(dense, np.concatenate([d[0] for d in days]))  # used as stored
    np.testing.assert_array_equal(labels, np.concatenate([d[2][:, 0] for d in days]))
    ids = torch.cat([b.sparse_features["cat_7"].values() for b in batches]).numpy()
    np.testing.assert_array_equal(ids, np.concatenate([d[1][:, 7] for d in days]))


def test_torchrec_multi_hot_npz(tmp_path):
    rows, sizes = 19, [1 + (t % 4) for t in range(26)]
    write_torchrec_day(tmp_path, 0, rows)
    bags = {str(t): rng.integers(0, 500, (rows, k)).astype(np.int32) for t, k in enumerate(sizes)}
    np.savez(tmp_path / "day_0_sparse_multi_hot.npz", **bags)
    assert detect_format(tmp_path) == "torchrec_multi_hot"
    batches = collect(open_parts(tmp_path), batch=8)
    for t in (0, 3, 25):
        jt = [b.sparse_features[f"cat_{t}"] for b in batches]
        assert all(torch.all(j.lengths() == sizes[t]) for j in jt)
        values = torch.cat([j.values() for j in jt]).numpy()
        np.testing.assert_array_equal(values, bags[str(t)].reshape(-1))


def test_compressed_npz_is_refused_with_a_clear_error(tmp_path):
    write_torchrec_day(tmp_path, 0, 4)
    np.savez_compressed(tmp_path / "day_0_sparse_multi_hot.npz", **{str(t): np.zeros((4, 2), np.int32)
                                                                     for t in range(26)})
    with pytest.raises(ValueError, match="compressed"):
        open_parts(tmp_path)


def test_facebook_terabyte_bin(tmp_path):
    splits = {}
    for name, rows in [("train", 30), ("test", 9), ("val", 8)]:
        data = np.concatenate([
            rng.integers(0, 2, (rows, 1)), rng.integers(-3, 5000, (rows, 13)), rng.integers(0, 10**6, (rows, 26)),
        ], axis=1).astype(np.int32)
        data.tofile(tmp_path / f"terabyte_processed_{name}.bin")
        splits[name] = data
    assert detect_format(tmp_path) == "facebook_bin"
    parts = open_parts(tmp_path)
    assert [p.name for p in parts] == ["train", "test", "val"]
    train, evaluation = mlperf_split(parts)
    assert [p.name for p in train] == ["train"] and [p.name for p in evaluation] == ["test"]
    batches = collect(evaluation, batch=4)
    want = splits["test"]
    dense = torch.cat([b.dense_features for b in batches]).numpy()
    np.testing.assert_allclose(dense, np.log1p(np.maximum(want[:, 1:14], 0)).astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(torch.cat([b.labels for b in batches]).numpy(), want[:, 0])
    ids = torch.cat([b.sparse_features["cat_25"].values() for b in batches]).numpy()
    np.testing.assert_array_equal(ids, want[:, 39])


def test_truncated_bin_is_refused(tmp_path):
    (tmp_path / "terabyte_processed_train.bin").write_bytes(b"\0" * (40 * 4 * 3 + 8))
    with pytest.raises(ValueError, match="not a whole number"):
        open_parts(tmp_path)


def test_wrong_shapes_named(tmp_path):
    write_torchrec_day(tmp_path, 0, 10)
    np.save(tmp_path / "day_0_labels.npy", np.zeros((9, 1), np.int32))
    with pytest.raises(ValueError, match="day_0_labels.npy: shape"):
        open_parts(tmp_path)


def test_unknown_directory_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dataset.json"):
        open_parts(tmp_path)
