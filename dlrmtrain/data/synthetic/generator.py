"""Synthetic Criteo-like data: skewed categorical ids and labels from a hidden teacher.

Ids of table t follow a bounded power law, P(id = k) ∝ (k + 1)^-s, so a batch
repeats hot rows the way real Criteo batches do. Labels come from a fixed,
randomly drawn logistic "teacher" over the dense features, one scalar per
(table, id) and a few pairwise table interactions, so the AUC a model reaches
measures real learning. Every rank generates the same arrays from the same
seeds, so any world size sees the same global batches.

Profiles (`data.synthetic.profile`): `custom` uses data.table_sizes and one
zipf_exponent; `kaggle` and `terabyte` replace both with calibrated sizes and
per-table exponents (profiles.py). To write the data to disk in the
project's layout instead, see data_prep/make_synthetic.py.
"""

from __future__ import annotations

import functools

import numpy as np

from dlrmtrain.config.schema import DataConfig
from dlrmtrain.data.parts import RowBlock
from dlrmtrain.data.synthetic.profiles import profile_tables

# Teacher lookup tables are capped so huge vocabularies cost no memory; ids
# beyond the cap share teacher weights by `id mod cap`.
_TEACHER_ROWS = 1 << 16


def power_law_ids(rng: np.random.Generator, num_rows: int, exponent: float,
                  size: int) -> np.ndarray:
    """Draw ids in [0, num_rows) with P(k) ∝ (k + 1)^-exponent (inverse-CDF of the
    continuous bounded power law, so no per-row table is needed)."""
    u = rng.random(size)
    if abs(exponent - 1.0) < 1e-9:
        x = np.power(num_rows + 1.0, u)
    else:
        a = 1.0 - exponent
        x = np.power(u * (np.power(num_rows + 1.0, a) - 1.0) + 1.0, 1.0 / a)
    return np.minimum(x.astype(np.int64) - 1, num_rows - 1).clip(min=0)


class Teacher:
    """The hidden labelling function; fixed by its seed and the table count."""

    def __init__(self, num_tables: int, num_dense: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.dense_w = rng.normal(0.0, 0.15, num_dense)
        self.table_w = rng.normal(0.0, 1.0, (num_tables, _TEACHER_ROWS)) * \
            rng.uniform(0.3, 1.5, (num_tables, 1))
        self.pairs = rng.choice(num_tables, size=(4, 2), replace=False)
        self.pair_w = rng.normal(0.0, 0.8, (len(self.pairs), 64, 64))
        for weights in (self.dense_w, self.table_w, self.pairs, self.pair_w):
            weights.flags.writeable = False  # shared by every `generate` of this process

    def logits(self, dense: np.ndarray, sparse: np.ndarray) -> np.ndarray:
        z = (dense - dense.mean(0)) / (dense.std(0) + 1e-6) @ self.dense_w
        folded = sparse % _TEACHER_ROWS
        z += self.table_w[np.arange(sparse.shape[1])[None, :], folded].sum(1) / np.sqrt(sparse.shape[1])
        for (a, b), w in zip(self.pairs, self.pair_w):
            z += w[sparse[:, a] % 64, sparse[:, b] % 64]
        return z


@functools.lru_cache(maxsize=2)
def _teacher(num_tables: int, num_dense: int, seed: int) -> Teacher:
    """The one Teacher of these arguments in this process: drawing its 1.7 M weights costs
    ~0.15 s, and a run draws its training and its eval samples with the same teacher (a
    process that builds several runs, as a test's spawned ranks do, reuses it again)."""
    return Teacher(num_tables, num_dense, seed)


def tables_and_exponents(cfg: DataConfig) -> tuple[list[int], list[float]]:
    """Table sizes and per-table id skew: from the profile, or table_sizes + zipf_exponent (`custom`)."""
    syn = cfg.synthetic
    if syn.profile == "custom":
        return list(cfg.table_sizes), [syn.zipf_exponent] * len(cfg.table_sizes)
    return profile_tables(syn.profile, syn.terabyte_tables, syn.scale)


def generate(cfg: DataConfig, num_samples: int, seed: int) -> RowBlock:
    """`num_samples` samples drawn with `seed`; labels from the config's teacher.
    Dense float32 [N, 13] (log-transformed), sparse int64 [N, T] ids, labels float32 [N]."""
    syn = cfg.synthetic
    rng = np.random.default_rng(seed)
    counts = rng.lognormal(mean=1.0, sigma=1.5, size=(num_samples, cfg.num_dense_features))
    dense = np.log1p(np.floor(counts)).astype(np.float32)
    sizes, exponents = tables_and_exponents(cfg)
    sparse = np.stack([power_law_ids(rng, rows, s, num_samples) for rows, s in zip(sizes, exponents)], axis=1)
    teacher = _teacher(len(sizes), cfg.num_dense_features, syn.teacher_seed)
    z = teacher.logits(dense, sparse)
    z = z - np.quantile(z, 0.75)  # ~25% clicks, like the Kaggle sample
    noise = rng.logistic(0.0, syn.label_noise, num_samples)
    labels = (z + noise > 0).astype(np.float32)
    return RowBlock(dense=dense, sparse=sparse, labels=labels)


def multi_hot_offsets(table_sizes: list[int], bag_sizes: list[int], seed: int) -> list[np.ndarray]:
    """Per-table fixed offsets turning id x into the bag (x + offsets) mod rows;
    offset 0 first, so the one-hot id stays in its own bag."""
    rng = np.random.default_rng(seed)
    out = []
    for rows, k in zip(table_sizes, bag_sizes):
        extra = rng.integers(1, max(rows, 2), size=k - 1) if k > 1 else np.zeros(0, np.int64)
        out.append(np.concatenate([[0], extra]).astype(np.int64))
    return out
