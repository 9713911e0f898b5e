"""Preprocessing reruns after an interruption (issue 13, bug 4 and leftovers)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dlrmtrain.data.preprocess.pipeline import _build_vocabulary, preprocess
from tests.data.raw_rows import random_raw_lines, write_lines
from tests.data.preprocess.test_pipeline import HASH_RANGE, load_everything, write_days


def test_source_replaced_after_pass_1_is_staged_again(tmp_path):
    """Bug 4: a rerun converted the staged OLD content of a file replaced after pass 1
    and exited 0 (only a third run noticed)."""
    paths, _ = write_days(tmp_path)
    out = tmp_path / "out"
    _build_vocabulary(paths, out, HASH_RANGE, "error", 1, False)  # a run stopped after pass 1
    write_lines(paths[1], random_raw_lines(180, seed=99))  # same name, new content
    os.utime(paths[1], ns=(10**9, 10**9))
    rerun = preprocess(paths, out, "mlperf_vocab", hash_range=HASH_RANGE, progress=False)
    fresh = preprocess(paths, tmp_path / "fresh", "mlperf_vocab", hash_range=HASH_RANGE,
                       progress=False)
    assert [f.rows for f in rerun.files] == [300, 180, 200]
    assert rerun.table_sizes == fresh.table_sizes
    for got, want in zip(load_everything(out), load_everything(tmp_path / "fresh")):
        np.testing.assert_array_equal(got, want)


def test_source_replaced_after_pass_2_began_is_refused(tmp_path):
    """Once a part is written with the old vocabulary, restaging one file would leave
    the parts inconsistent: refused, naming what to do."""
    from dlrmtrain.data.preprocess import pipeline as pp

    paths, _ = write_days(tmp_path)
    out = tmp_path / "out"
    vocab = _build_vocabulary(paths, out, HASH_RANGE, "error", 1, False)
    pp._init_worker(None, vocab)  # pass 2 stopped after its first file
    try:
        pp._remap_staged_part(paths[0], str(out), "error")
    finally:
        pp._init_worker(None)
    write_lines(paths[1], random_raw_lines(180, seed=99))
    os.utime(paths[1], ns=(10**9, 10**9))
    with pytest.raises(ValueError, match=r"day_1.*changed after pass 1.*\['day_0'\].*delete"):
        preprocess(paths, out, "mlperf_vocab", hash_range=HASH_RANGE, progress=False)


def test_temporary_folders_of_dead_writers_are_removed_at_the_next_start(tmp_path):
    paths, _ = write_days(tmp_path, rows_per_day=(50,))
    out = tmp_path / "out"
    dead = out / "parts" / ".day_9.tmp-999999999"  # no such pid
    alive = out / "parts" / f".day_8.tmp-{os.getpid()}"
    for d in (dead, alive):
        d.mkdir(parents=True)
    preprocess(paths, out, "mlperf_vocab", hash_range=HASH_RANGE, progress=False)
    assert not dead.exists() and alive.exists()
