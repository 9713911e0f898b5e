"""Vocabulary: distinct counting, rank mapping and plain hashing against direct numpy computations."""

from __future__ import annotations

import numpy as np
import pytest

from dlrmtrain.data.preprocess.vocab import DistinctCounter, MlperfVocabulary, PlainHash


# 1003: columns end in a partial 8-value word. 4_000_000: MLPerf's case (40M) at a tenth of
# the size: a multiple of 64, mostly empty words skipped 8 values at a time.
@pytest.mark.parametrize("hash_range", [1003, 4_000_000])
def test_counter_and_vocabulary_match_unique_and_searchsorted(hash_range):
    rng = np.random.default_rng(0)
    files = [rng.integers(0, 2**32, (n, 26), dtype=np.uint64).astype(np.uint32) for n in (3000, 1700)]
    files[1][:, 5] = 7  # a one-value column
    per_file = []
    for cats in files:
        counter = DistinctCounter(hash_range)
        counter.add(cats[:1000])
        counter.add(cats[1000:])
        per_file.append(counter.distinct_values())
        for col in (0, 5, 25):
            np.testing.assert_array_equal(per_file[-1][col], np.unique(cats[:, col].astype(np.int64) % hash_range))
    vocab = MlperfVocabulary.from_distinct(per_file, hash_range)
    everything = np.concatenate(files).astype(np.int64) % hash_range
    for col in range(26):
        distinct = np.unique(everything[:, col])
        assert vocab.table_sizes[col] == len(distinct)
        np.testing.assert_array_equal(vocab.map(files[0])[:, col], np.searchsorted(distinct, files[0][:, col] % hash_range))


def test_vocabulary_save_load_and_unknown_value(tmp_path):
    counter = DistinctCounter(1000)
    cats = np.arange(26 * 4, dtype=np.uint32).reshape(4, 26)
    counter.add(cats)
    vocab = MlperfVocabulary.from_distinct([counter.distinct_values()], 1000)
    vocab.save(tmp_path / "v.npz")
    again = MlperfVocabulary.load(tmp_path / "v.npz")
    np.testing.assert_array_equal(again.map(cats), np.tile(np.arange(4)[:, None], (1, 26)))
    unknown = cats.copy()
    unknown[2, 3] = 999
    with pytest.raises(KeyError, match="C4 value 000003e7"):
        again.map(unknown)


def test_plain_hash():
    sizes = list(range(2, 28))
    cats = np.full((3, 26), 2**32 - 1, dtype=np.uint32)
    np.testing.assert_array_equal(PlainHash(sizes).map(cats), np.tile((2**32 - 1) % np.array(sizes), (3, 1)))
    with pytest.raises(ValueError, match="26 positive table sizes"):
        PlainHash([10] * 25)
