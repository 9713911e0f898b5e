"""Multi-hot bags reproduce the MLPerf DCNv2 reference's lookup tables; materialised days read back."""

from __future__ import annotations

import numpy as np
import torch

from dlrmtrain.data.formats.foreign import TorchRecDayPart, TorchRecMultiHotPart
from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
from dlrmtrain.data.preprocess.multi_hot import MultiHotLookup, MultiHotPart, materialize_day

SIZES = [50 + 7 * t for t in range(26)]
BAGS = [1 + (t * 5) % 7 for t in range(26)]


def reference_tables(table_sizes, multi_hot_sizes):
    """The reference's algorithm, written out independently: global seed 0, one randint per table."""
    np.random.seed(0)
    tables = []
    for n, k in zip(table_sizes, multi_hot_sizes):
        extra = np.random.randint(0, n, size=(n, k - 1))
        tables.append(np.concatenate((np.arange(n)[:, None], extra), axis=-1))
    return tables


def test_lookup_matches_reference_even_when_built_in_chunks(tmp_path):
    want = reference_tables(SIZES, BAGS)
    for lookup in (MultiHotLookup(SIZES, BAGS), MultiHotLookup(SIZES, BAGS, chunk_rows=13),
                   MultiHotLookup(SIZES, BAGS, cache_dir=tmp_path, chunk_rows=17)):
        for t in range(26):
            np.testing.assert_array_equal(lookup.tables[t], want[t])
    cached = MultiHotLookup(SIZES, BAGS, cache_dir=tmp_path)  # reopened from the cache
    assert isinstance(cached.tables[0], np.memmap)
    np.testing.assert_array_equal(cached.tables[25], want[25])


def test_bag_is_a_function_of_the_id_and_starts_with_it():
    lookup = MultiHotLookup(SIZES, BAGS)
    ids = np.array([3, 3, 49, 3 + SIZES[0]])  # the last wraps modulo the table size
    bags = lookup.expand(0, ids)
    assert bags.shape == (4, BAGS[0])
    assert (bags[0] == bags[1]).all() and (bags[0] == bags[3]).all()
    assert bags[:, 0].tolist() == [3, 3, 49, 3]


def test_materialized_day_reads_back_as_on_the_fly_bags(tmp_path):
    rows = 40
    rng = np.random.default_rng(1)
    sparse = rng.integers(0, 10**6, (rows, 26)).astype(np.int32)
    np.save(tmp_path / "day_0_dense.npy", rng.random((rows, 13), dtype=np.float32))
    np.save(tmp_path / "day_0_sparse.npy", sparse)
    np.save(tmp_path / "day_0_labels.npy", rng.integers(0, 2, (rows, 1)).astype(np.int32))
    lookup = MultiHotLookup(SIZES, BAGS)
    one_hot = TorchRecDayPart(tmp_path, 0)
    materialize_day(one_hot, lookup, tmp_path / "day_0_sparse_multi_hot.npz", chunk_rows=16)
    on_disk = TorchRecMultiHotPart(tmp_path, 0)
    on_the_fly = MultiHotPart(one_hot, lookup)
    want = reference_tables(SIZES, BAGS)
    for part in (on_disk, on_the_fly):
        batches = list(CriteoBatchLoader([part], CriteoLoaderSpec(16, last_batch="partial", prefetch=0)))
        for t in (0, 13, 25):
            values = torch.cat([b.sparse_features[f"cat_{t}"].values() for b in batches]).numpy()
            np.testing.assert_array_equal(values, want[t][sparse[:, t] % SIZES[t]].reshape(-1))
