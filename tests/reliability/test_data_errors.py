"""Every data-reading error names the file (or the table); nothing bad passes silently."""

from __future__ import annotations

import numpy as np
import pytest

from dlrmtrain.data.preprocess.pipeline import preprocess
from tests.common import tiny_overrides
from tests.data.raw_rows import random_raw_lines, write_lines
from tests.data.preprocess.test_pipeline import HASH_RANGE, load_everything


def test_truncated_gz_is_an_error_naming_the_file(tmp_path):
    path = write_lines(tmp_path / "day_0.gz", random_raw_lines(3000, seed=1), gz=True)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"day_0\.gz: truncated or corrupt gzip"):
        preprocess([path], tmp_path / "out", "mlperf_vocab", hash_range=HASH_RANGE, progress=False)


def test_empty_input_is_an_error(tmp_path):
    empty = tmp_path / "day_0"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"day_0: empty input"):
        preprocess([empty], tmp_path / "out", "hash", table_sizes=[10] * 26, progress=False)
    assert not (tmp_path / "out" / "dataset.json").exists()


def test_crlf_line_endings_are_accepted_and_counted(tmp_path):
    lines = random_raw_lines(200, seed=2)
    for sub in ("lf", "crlf"):
        (tmp_path / sub).mkdir()
    lf = write_lines(tmp_path / "lf" / "day_0", lines)
    crlf = tmp_path / "crlf" / "day_0"
    crlf.write_bytes(lf.read_bytes().replace(b"\n", b"\r\n"))
    want = preprocess([lf], tmp_path / "out_lf", "mlperf_vocab", hash_range=HASH_RANGE, progress=False)
    got = preprocess([crlf], tmp_path / "out_crlf", "mlperf_vocab", hash_range=HASH_RANGE,
                     progress=False)
    assert got.bad_lines.count == 0 and got.bad_lines.crlf_lines == 200
    assert "CR LF line endings: 200 lines" in got.render()
    assert "CR LF" not in want.render()
    for a, b in zip(load_everything(tmp_path / "out_crlf"), load_everything(tmp_path / "out_lf")):
        np.testing.assert_array_equal(a, b)


def test_skipped_bad_lines_show_examples_in_mlperf_vocab_mode(tmp_path):
    lines = random_raw_lines(100, seed=3)
    lines[6] = "2" + lines[6][1:]  # label 2
    path = write_lines(tmp_path / "day_0", lines)
    summary = preprocess([path], tmp_path / "out", "mlperf_vocab", hash_range=HASH_RANGE,
                         bad_lines="skip", progress=False)
    assert summary.bad_lines.count == 1
    assert f"e.g. {path}:7: field label" in summary.render()
    again = preprocess([path], tmp_path / "out", "mlperf_vocab", hash_range=HASH_RANGE,
                       bad_lines="skip", progress=False)  # all skipped as finished: still shown
    assert f"e.g. {path}:7: field label" in again.render()


def test_truncated_npy_is_an_error_naming_the_file(tmp_path):
    from dlrmtrain.data.sources import open_parts

    n = 40
    np.save(tmp_path / "day_0_dense.npy", np.zeros((n, 13), np.float32))
    np.save(tmp_path / "day_0_labels.npy", np.zeros((n, 1), np.int32))
    np.save(tmp_path / "day_0_sparse.npy", np.zeros((n, 26), np.int32))
    sparse = tmp_path / "day_0_sparse.npy"
    sparse.write_bytes(sparse.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"day_0_sparse\.npy: not a readable \.npy array"):
        open_parts(tmp_path, "torchrec")


def _dataset_and_config(tmp_path, *overrides):
    from dlrmtrain.config import load_config
    from dlrmtrain.data.synthetic.files import write_synthetic_dataset

    base = tiny_overrides(str(tmp_path))
    write_synthetic_dataset(load_config(None, base).data, tmp_path / "ds", rows_per_part=512,
                            num_parts=2, progress=False)
    return load_config(None, base + [
        "data.source=criteo", f"data.path={tmp_path / 'ds'}", "data.format=dlrmtrain",
        "data.split=names", "data.train_parts=[day_0]", "data.eval_parts=[day_1]",
        "data.prefetch_batches=0", *overrides])


def _flip_id(tmp_path, row: int, table: int) -> None:
    """Set the high byte of one stored id: a huge id, as a flipped bit would make."""
    path = tmp_path / "ds" / "parts" / "day_0" / "sparse.i32"
    data = bytearray(path.read_bytes())
    data[(row * 26 + table) * 4 + 3] = 0x40
    path.write_bytes(bytes(data))


def test_corrupt_part_is_found_at_open_naming_the_file(tmp_path):
    from dlrmtrain.workloads import build_datasets

    cfg = _dataset_and_config(tmp_path)
    _flip_id(tmp_path, row=300, table=5)
    with pytest.raises(ValueError, match=r"parts/day_0/sparse\.i32: sha256 mismatch"):
        build_datasets(cfg, 0, 1)


def test_id_outside_its_table_is_an_error_naming_the_table(tmp_path):
    from dlrmtrain.workloads import build_datasets

    cfg = _dataset_and_config(tmp_path, "data.verify=false")  # as on a terabyte run
    _flip_id(tmp_path, row=300, table=5)
    data = build_datasets(cfg, 0, 1)
    with pytest.raises(ValueError, match=r"table t_cat_5: id \d+ in rows 256\.\.511 is outside"):
        list(data.train_batches(0, 0))
