"""A full disk in preprocess, on a real tiny file system (a tmpfs mounted for the test):
too little space is refused before anything is written, with the estimate and the free
space; a write that fails anyway names the file and its sizes, and leaves no temporary file."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess

import numpy as np
import pytest

from dlrmtrain.data.formats.writes import OutputWriteError
from dlrmtrain.data.preprocess.cli import main as preprocess_main
from dlrmtrain.data.preprocess.space import SAMPLE_BYTES, estimate_rows
from dlrmtrain.data.preprocess.vocab import MlperfVocabulary
from tests.data.raw_rows import random_raw_lines, write_lines


@pytest.fixture
def tiny_fs(tmp_path):
    """mount(size) -> a fresh tmpfs of `size` ("1m"), unmounted at teardown."""
    mounts = []

    def mount(size: str):
        if os.geteuid() != 0:
            pytest.skip("mounting a tiny tmpfs needs root")
        where = tmp_path / f"fs{len(mounts)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def leftovers(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp" in p.name)


def used_bytes(fs) -> int:
    usage = shutil.disk_usage(fs)
    return usage.total - usage.free


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_too_little_space_is_refused_before_anything_is_written(tmp_path, tiny_fs, capsys):
    fs = tiny_fs("4m")
    day = write_lines(tmp_path / "day_0", random_raw_lines(300, seed=1))
    # the MLPerf vocabulary alone is 124 MB (one bit per hashed value and column), whatever the input
    assert preprocess_main(["--out", str(fs / "out"), str(day)]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert f"{fs / 'out'} needs about" in line and "vocabulary 124.0 MB" in line, line
    assert "4.0 MB free" in line and "nothing was written" in line, line
    assert list(fs.iterdir()) == []

    # what fits still runs on the same file system: plain hashing writes 157 bytes a row
    assert preprocess_main(["--out", str(fs / "out"), "--mode", "hash", "--table-sizes", "1000", str(day)]) == 0
    assert (fs / "out" / "dataset.json").is_file()


def _compressible_day(path, random_rows: int, repeated_rows: int):
    """A gzip day whose first MB is varied text and whose rest is one line over and over:
    its first MB holds far fewer rows per byte than the rest, so the estimate is too low."""
    rng = np.random.default_rng(7)
    cats = rng.integers(0, 2**32, size=(random_rows, 26), dtype=np.uint64)
    dense = rng.integers(0, 10**6, size=(random_rows, 13))
    varied = ["\t".join(["1", *map(str, d), *(f"{int(c):08x}" for c in row)]) for d, row in zip(dense, cats)]
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write("\n".join(varied) + "\n")
        f.write((varied[0] + "\n") * repeated_rows)
    return path


def test_a_write_that_fails_anyway_names_the_file_and_sizes_and_leaves_nothing(tmp_path, tiny_fs, capsys):
    fs = tiny_fs("3m")
    day = _compressible_day(tmp_path / "day_0.gz", 8000, 40000)
    assert day.stat().st_size > SAMPLE_BYTES  # the estimate sees only the varied start
    assert estimate_rows(day) < 10000  # 48000 rows in truth: past the 3 MB at 157 bytes a row
    out = fs / "out"
    rc = preprocess_main(["--out", str(out), "--mode", "hash", "--table-sizes", "1000", str(day)])
    [line] = error_lines(capsys.readouterr().err)
    assert rc == 3, line
    assert f"could not write {out}/parts/day_0/" in line and "no space left on device" in line, line
    assert " MB of about " in line and "expected" in line and "free there" in line, line
    assert "removed the unfinished part .day_0.tmp-" in line, line
    assert leftovers(fs) == []
    assert used_bytes(fs) < 64 * 1024, [str(p) for p in fs.rglob("*")]  # the disk is not kept full


def test_a_vocabulary_that_does_not_fit_leaves_no_temporary_file(tiny_fs):
    fs = tiny_fs("1m")
    vocab = MlperfVocabulary.from_distinct([], 4_000_000)  # 13 MB of bitmaps
    with pytest.raises(OutputWriteError) as failed:
        vocab.save(fs / "vocabulary.npz")
    message = str(failed.value)
    assert message.startswith(f"could not write {fs / 'vocabulary.npz'} (no space left on device) after "), message
    assert "of about 12.5 MB expected" in message and "removed vocabulary.npz.tmp" in message, message
    assert list(fs.iterdir()) == []  # the old `vocabulary.npz.tmp.npz` kept the disk full


def test_yambda_preprocess_checks_the_space_before_writing(tmp_path, tiny_fs, capsys):
    from dlrmtrain.data.yambda.preprocess import main as yambda_main
    from tests.data.yambda.test_parquet_samples import write_dataset

    write_dataset(tmp_path)
    args = ["--events", str(tmp_path / "multi_event.parquet"), "--train-days", "2",
            "--artists", str(tmp_path / "artist_item_mapping.parquet"),
            "--albums", str(tmp_path / "album_item_mapping.parquet")]
    small, roomy = tiny_fs("32k"), tiny_fs("1m")
    assert yambda_main([*args, "--out", str(small / "prep")]) == 2
    [line] = error_lines(capsys.readouterr().err)
    assert f"{small / 'prep'} needs about " in line and "(store " in line and "32.0 KB free" in line, line
    assert list(small.iterdir()) == []
    assert yambda_main([*args, "--out", str(roomy / "prep")]) == 0
    assert (roomy / "prep" / "store.json").is_file() and not (roomy / "prep" / "_buckets").exists()
