"""Synthetic data is one more source behind the file loader.

The references below restate the batching rules independently of the loader:
eval (unchanged from the former synthetic batcher): every sample once, each global
batch cut into W equal slices of ceil(n/W), slots past the data repeat the batch's
first row with weight 0; train: full global batches only, their order permuted per
(run.seed, epoch) as the file loader does (the former batcher permuted samples).
"""

from __future__ import annotations

import numpy as np
import pytest

from dlrmtrain.data.datasets import table_rows
from dlrmtrain.data.synthetic.generator import generate, multi_hot_offsets
from dlrmtrain.workloads import build_datasets
from tests.common import tiny_config

SMALL = ["data.synthetic.num_train_samples=1000", "data.synthetic.num_eval_samples=700",
         "run.global_batch_size=128", "eval.batch_size=192", "run.seed=5"]


def _rows(cfg, which, idx):
    """Rows `idx` of the generated train or eval set as (dense, per-table bags, labels),
    ids folded into the model's rows and, for multi-hot, turned into bags."""
    syn = cfg.data.synthetic
    n, seed = (syn.num_train_samples, 1) if which == "train" else (syn.num_eval_samples, 2)
    block = generate(cfg.data, n, seed=cfg.run.seed + seed)
    rows = np.asarray(table_rows(cfg))
    ids = block.sparse[idx] % rows
    if cfg.data.multi_hot_sizes is None:
        bags = [ids[:, t:t + 1] for t in range(ids.shape[1])]
    else:
        offsets = multi_hot_offsets(list(rows), cfg.data.multi_hot_sizes, cfg.run.seed + 7)
        bags = [(ids[:, t:t + 1] + offsets[t][None, :]) % rows[t] for t in range(ids.shape[1])]
    return block.dense[idx], bags, block.labels[idx]


def _assert_batch(batch, dense, bags, labels):
    np.testing.assert_array_equal(batch.dense_features.numpy(), dense)
    np.testing.assert_array_equal(batch.labels.numpy(), labels)
    kjt = batch.sparse_features.to_dict()
    for t, bag in enumerate(bags):
        jt = kjt[f"cat_{t}"]
        np.testing.assert_array_equal(jt.lengths().numpy(), np.full(len(bag), bag.shape[1]))
        np.testing.assert_array_equal(jt.values().numpy(), bag.reshape(-1))


def _eval_reference(n, batch, rank, world):
    for start in range(0, n, batch):
        stop = min(start + batch, n)
        local = -(-(stop - start) // world)
        lo = min(start + rank * local, stop)
        idx = np.arange(lo, min(lo + local, stop))
        weight = np.r_[np.ones(len(idx)), np.zeros(local - len(idx))]
        yield np.r_[idx, np.full(local - len(idx), start)].astype(np.int64), weight


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("multi_hot", [False, True])
def test_eval_batches_follow_the_former_rule(tmp_path, world, multi_hot):
    extra = ["data.multi_hot_sizes=" + str([3] * 26)] if multi_hot else []
    cfg = tiny_config(str(tmp_path), *SMALL, *extra)
    for rank in range(world):
        got = list(build_datasets(cfg, rank, world).eval_batches())
        want = list(_eval_reference(700, 192, rank, world))
        assert len(got) == len(want) == 4
        for (batch, weight), (idx, want_weight) in zip(got, want):
            np.testing.assert_array_equal(weight.numpy(), want_weight)
            _assert_batch(batch, *_rows(cfg, "eval", idx))


def test_train_batches_permute_full_batches_per_seed_and_epoch(tmp_path):
    cfg = tiny_config(str(tmp_path), *SMALL)
    world, local = 2, 64
    for epoch in (0, 1):
        order = np.random.default_rng([5, epoch]).permutation(1000 // 128)
        for rank in range(world):
            got = list(build_datasets(cfg, rank, world).train_batches(epoch))
            assert len(got) == len(order) == 7  # the last 1000 - 7 * 128 rows are dropped
            for batch, b in zip(got, order):
                start = b * 128 + rank * local
                _assert_batch(batch, *_rows(cfg, "train", np.arange(start, start + local)))
    # mid-epoch start (resume) reads the same batches from there on
    data = build_datasets(cfg, 1, world)
    full, tail = list(data.train_batches(1)), list(data.train_batches(1, 3))
    assert len(tail) == len(full) - 3
    for a, b in zip(full[3:], tail):
        assert a.labels.equal(b.labels) and a.sparse_features.values().equal(b.sparse_features.values())
