"""Loader: rank slicing covers every sample once, deterministic order, last-batch policies, batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrmtrain.data.formats.binary import PartWriter, write_manifest, finished_part_meta
from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
from dlrmtrain.data.sources import open_parts


def make_indexed_dataset(root, rows_per_part=(37, 0, 50, 13)):
    """Parts whose dense[:, 0] holds the global row index, so every yielded row is identifiable."""
    start = 0
    for i, rows in enumerate(rows_per_part):
        writer = PartWriter(root, f"day_{i}")
        index = np.arange(start, start + rows)
        dense = np.repeat(index[:, None], 13, axis=1).astype(np.float32)
        sparse = (index[:, None] * 26 + np.arange(26)).astype(np.int32)
        writer.append(dense, sparse, (index % 2).astype(np.uint8))
        writer.commit({"source": None})
        start += rows
    write_manifest(root, {"categorical_mode": "hash", "table_sizes": [10**6] * 26, "rows": start,
                          "parts": [finished_part_meta(root, f"day_{i}") for i in range(len(rows_per_part))]})
    return start


def rows_seen(loader, weighted=False):
    seen = []
    for batch, weight in loader.iter_weighted():
        index = batch.dense_features[:, 0].long()
        if weighted:
            index = index[weight > 0]
        seen.append(index)
    return torch.cat(seen).tolist() if seen else []


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("policy", ["partial", "pad"])
def test_every_sample_exactly_once_across_ranks(tmp_path, world_size, policy):
    total = make_indexed_dataset(tmp_path)
    seen = []
    for rank in range(world_size):
        loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(12, rank, world_size, shuffle=True, seed=5,
                                   last_batch=policy))
        seen += rows_seen(loader, weighted=True)
    assert sorted(seen) == list(range(total))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_pad_gives_equal_local_batches_and_zero_weight_filler(tmp_path, world_size):
    total = make_indexed_dataset(tmp_path)
    remainder = total % 12
    assert remainder == 4  # 100 rows
    sizes = []
    for rank in range(world_size):
        loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(12, rank, world_size, last_batch="pad"))
        batches = list(loader.iter_weighted())
        assert len(batches) == len(loader) == total // 12 + 1
        sizes.append([b.labels.shape[0] for b, _ in batches])
        last, weight = batches[-1]
        assert weight.shape[0] == -(-remainder // world_size)
        assert torch.all(last.dense_features[weight == 0, 0] == total - remainder)  # filler: first leftover row
    assert all(s == sizes[0] for s in sizes)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_drop_policy_counts_what_it_drops(tmp_path, world_size):
    total = make_indexed_dataset(tmp_path)
    seen = []
    for rank in range(world_size):
        loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(12, rank, world_size, last_batch="drop"))
        assert loader.dropped_rows == total % 12
        seen += rows_seen(loader)
    assert sorted(seen) == list(range(total - total % 12))


def test_rank_reads_only_its_contiguous_slice(tmp_path):
    make_indexed_dataset(tmp_path)
    loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(12, rank=1, world_size=3))
    first = next(iter(loader))
    assert first.dense_features[:, 0].tolist() == [4, 5, 6, 7]


def test_order_is_deterministic_per_seed_and_epoch(tmp_path):
    make_indexed_dataset(tmp_path)

    def order(seed, epoch, prefetch=2):
        loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(12, shuffle=True, seed=seed, prefetch=prefetch))
        loader.set_epoch(epoch)
        return rows_seen(loader)

    assert order(1, 0) == order(1, 0) == order(1, 0, prefetch=0)
    for workers in (2, 3):  # several threads making batches: the same batches, the same order
        loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(12, shuffle=True, seed=1, workers=workers))
        assert rows_seen(loader) == order(1, 0)
    assert order(1, 0) != order(2, 0)
    assert order(1, 0) != order(1, 1)
    assert sorted(order(1, 0)) == sorted(order(2, 0))
    unshuffled = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(12, shuffle=False))
    assert rows_seen(unshuffled) == list(range(96))


def test_batch_contents_and_types(tmp_path):
    make_indexed_dataset(tmp_path)
    batch = next(iter(CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(8, rank=0, world_size=2))))
    assert batch.dense_features.dtype == torch.float32 and batch.dense_features.shape == (4, 13)
    assert batch.labels.dtype == torch.float32 and batch.labels.tolist() == [0, 1, 0, 1]
    kjt = batch.sparse_features
    assert kjt.values().dtype == torch.int64
    per_key = kjt.to_dict()
    for t in range(26):
        assert per_key[f"cat_{t}"].values().tolist() == [r * 26 + t for r in range(4)]


def test_batch_spanning_parts_and_fold(tmp_path):
    make_indexed_dataset(tmp_path, rows_per_part=(5, 7))
    loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(8, fold_to_rows=[100] * 26))
    batch = next(iter(loader))
    assert batch.dense_features[:, 0].tolist() == list(range(8))
    assert batch.sparse_features["cat_3"].values().tolist() == [(r * 26 + 3) % 100 for r in range(8)]


def test_prefetch_forwards_errors_and_stops_early(tmp_path):
    make_indexed_dataset(tmp_path)
    loader = CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(12, prefetch=2))
    for i, _ in enumerate(loader):  # consumer stops early: the producer thread must not hang
        if i == 1:
            break

    class Broken:
        name, rows = "broken", 20

        def read(self, start, stop):
            raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        list(CriteoBatchLoader([Broken()], CriteoLoaderSpec(4, prefetch=2)))


def test_abandoning_prefetch_after_the_producer_finished_does_not_hang():
    """The producer has made every item and waits to hand over the end marker into a
    full queue; closing the consumer must still stop it (this hung at process exit)."""
    import threading
    import time

    from dlrmtrain.data.prefetch import Prefetcher

    gen = Prefetcher(lambda x: x, [0, 1], depth=1)
    assert next(gen) == 0
    time.sleep(0.5)  # let the producer queue item 1 and block on the end marker
    closer = threading.Thread(target=gen.close, daemon=True)
    closer.start()
    closer.join(timeout=30)  # a hang detector, not a timing check
    assert not closer.is_alive(), "closing the prefetching generator hung"


def test_invalid_arguments(tmp_path):
    make_indexed_dataset(tmp_path)
    with pytest.raises(ValueError, match="not divisible by world size 3"):
        CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(8, 0, 3))
    with pytest.raises(ValueError, match="last_batch must be one of"):
        CriteoBatchLoader(open_parts(tmp_path), CriteoLoaderSpec(8, last_batch="wrap"))
