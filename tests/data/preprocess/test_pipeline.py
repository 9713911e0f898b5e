"""Raw files -> preprocessing (both categorical modes) -> loader, checked against an independent parse."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest
import torch

from dlrmtrain.data.formats import binary as bf
from dlrmtrain.data.formats.criteo_text import BadLineError
from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
from dlrmtrain.data.preprocess.pipeline import preprocess
from dlrmtrain.data.sources import open_parts
from tests.data.raw_rows import (
    expected_dense, expected_vocab_ids, independent_parse, random_raw_lines, shared_data_dir, write_lines,
)

HASH_RANGE = 1000  # small modulus: collisions happen, and the vocabulary stays tiny


def load_everything(out_dir):
    """Every row of a preprocessed dataset through the loader, as numpy (dense, ids [N, 26], labels)."""
    loader = CriteoBatchLoader(open_parts(out_dir), CriteoLoaderSpec(global_batch_size=64, last_batch="partial"))
    dense, ids, labels = [], [], []
    for batch in loader:
        n = batch.labels.shape[0]
        dense.append(batch.dense_features.numpy())
        kjt = batch.sparse_features
        assert kjt.keys() == [f"cat_{i}" for i in range(26)]
        assert torch.all(kjt.lengths() == 1)
        ids.append(kjt.values().reshape(26, n).T.numpy())
        labels.append(batch.labels.numpy())
    return np.concatenate(dense), np.concatenate(ids), np.concatenate(labels)


def write_days(tmp_path, rows_per_day=(300, 250, 200)):
    lines = [random_raw_lines(n, seed=10 + i) for i, n in enumerate(rows_per_day)]
    paths = [write_lines(tmp_path / f"day_{i}.gz", day, gz=(i % 2 == 0)) for i, day in enumerate(lines)]
    return paths, lines


@pytest.mark.parametrize("workers", [1, 2])
def test_mlperf_vocab_round_trip(tmp_path, workers):
    paths, lines = write_days(tmp_path)
    summary = preprocess(paths, tmp_path / "out", "mlperf_vocab", hash_range=HASH_RANGE,
                         workers=workers, progress=False)
    parsed = [independent_parse(day) for day in lines]
    want_ids = expected_vocab_ids([p[2] for p in parsed], HASH_RANGE)
    dense, ids, labels = load_everything(tmp_path / "out")
    np.testing.assert_array_equal(labels, np.concatenate([p[0] for p in parsed]))
    np.testing.assert_array_equal(dense, np.concatenate([expected_dense(p[1]) for p in parsed]))
    np.testing.assert_array_equal(ids, np.concatenate(want_ids))
    all_hashed = np.concatenate([p[2] for p in parsed]) % HASH_RANGE
    assert summary.table_sizes == [len(np.unique(all_hashed[:, c])) for c in range(26)]
    manifest = bf.read_manifest(tmp_path / "out")
    assert [p["rows"] for p in manifest["parts"]] == [300, 250, 200]
    assert manifest["table_sizes"] == summary.table_sizes
    for part in manifest["parts"]:
        bf.verify_part_checksums(tmp_path / "out", part["name"])


def test_hash_mode_round_trip(tmp_path):
    paths, lines = write_days(tmp_path)
    sizes = [97 + 13 * c for c in range(26)]
    preprocess(paths, tmp_path / "out", "hash", table_sizes=sizes, progress=False)
    parsed = [independent_parse(day) for day in lines]
    dense, ids, labels = load_everything(tmp_path / "out")
    np.testing.assert_array_equal(ids, np.concatenate([p[2] for p in parsed]) % np.array(sizes))
    np.testing.assert_array_equal(dense, np.concatenate([expected_dense(p[1]) for p in parsed]))
    assert bf.read_manifest(tmp_path / "out")["table_sizes"] == sizes


def test_resume_skips_finished_and_redoes_interrupted(tmp_path):
    paths, _ = write_days(tmp_path)
    out = tmp_path / "out"
    first = preprocess(paths, out, "mlperf_vocab", hash_range=HASH_RANGE, progress=False)
    # Simulate an interruption while day_1 was being rewritten: its finished copy is gone and a
    # half-written temporary directory is left behind.
    import shutil
    shutil.rmtree(out / "parts" / "day_1")
    (out / "parts" / ".day_1.tmp-999").mkdir()
    (out / "parts" / ".day_1.tmp-999" / "dense.f32").write_bytes(b"partial")
    second = preprocess(paths, out, "mlperf_vocab", hash_range=HASH_RANGE, progress=False)
    assert [f.skipped for f in second.files] == [True, False, True]
    assert [f.rows for f in second.files] == [f.rows for f in first.files]
    bf.verify_part_checksums(out, "day_1")
    assert "2 already finished (skipped)" in second.render()


def test_resume_refuses_changed_source(tmp_path):
    paths, lines = write_days(tmp_path)
    preprocess(paths, tmp_path / "out", "hash", table_sizes=[100] * 26, progress=False)
    write_lines(paths[1], lines[1][:10])  # same name, different content
    os.utime(paths[1], ns=(1, 1))
    with pytest.raises(ValueError, match="different"):
        preprocess(paths, tmp_path / "out", "hash", table_sizes=[100] * 26, progress=False)


def test_checksum_detects_corruption(tmp_path):
    paths, _ = write_days(tmp_path, rows_per_day=(50,))
    preprocess(paths, tmp_path / "out", "hash", table_sizes=[100] * 26, progress=False)
    sparse = tmp_path / "out" / "parts" / "day_0" / "sparse.i32"
    data = bytearray(sparse.read_bytes())
    data[0] ^= 1
    sparse.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sparse.i32: sha256 mismatch"):
        bf.verify_part_checksums(tmp_path / "out", "day_0")


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_lines_through_preprocess(tmp_path, workers):
    paths, lines = write_days(tmp_path)
    bad = "\t".join(["0"] + ["x"] * 13 + ["0a0b0c0d"] * 26)
    write_lines(paths[1], lines[1][:3] + [bad] + lines[1][3:])
    with pytest.raises(BadLineError, match=r"day_1.gz:4: field I1"):
        preprocess(paths, tmp_path / "out", "hash", table_sizes=[100] * 26, workers=workers, progress=False)
    assert not (tmp_path / "out" / "parts" / "day_1").exists()  # nothing half-written is left as done
    summary = preprocess(paths, tmp_path / "out2", "hash", table_sizes=[100] * 26, bad_lines="skip",
                         workers=workers, progress=False)
    assert summary.bad_lines.count == 1
    assert "bad lines skipped: 1" in summary.render() and "day_1.gz:4" in summary.render()
    assert sum(f.rows for f in summary.files) == sum(len(day) for day in lines)


def _sample_lines(limit=None):
    path = shared_data_dir() / "criteo_kaggle_sample.tsv.gz"
    if not path.exists():
        pytest.skip(f"real Criteo sample not found at {path} (set DLRMTRAIN_SHARED_DATA)")
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    return path, lines[:limit] if limit else lines


@pytest.mark.parametrize("mode", ["mlperf_vocab", "hash"])
def test_real_sample_round_trip(tmp_path, mode):
    path, lines = _sample_lines()
    sizes = [1 << 17] * 26
    summary = preprocess([path], tmp_path / "out", mode, table_sizes=sizes, progress=False)
    labels, raw_dense, cats = independent_parse(lines)
    dense, ids, got_labels = load_everything(tmp_path / "out")
    assert len(got_labels) == len(lines) == summary.files[0].rows
    np.testing.assert_array_equal(got_labels, labels)
    np.testing.assert_array_equal(dense, expected_dense(raw_dense))
    if mode == "hash":
        np.testing.assert_array_equal(ids, cats % (1 << 17))
    else:
        np.testing.assert_array_equal(ids, expected_vocab_ids([cats], 40_000_000)[0])
        assert summary.table_sizes == [len(np.unique(cats[:, c] % 40_000_000)) for c in range(26)]
    meta = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert meta["rows"] == len(lines)
