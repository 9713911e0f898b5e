"""Synthetic `kaggle` / `terabyte` profiles reproduce the measured per-batch distinct fractions."""

from __future__ import annotations

import numpy as np
import pytest

from dlrmtrain.data.datasets import table_rows
from dlrmtrain.features import MLPERF_DCNV2_TABLE_SIZES, MLPERF_V1_TABLE_SIZES
from dlrmtrain.data.synthetic.generator import generate, power_law_ids
from dlrmtrain.data.synthetic.profiles import KAGGLE_SAMPLE_COLUMNS, expected_distinct_fraction, terabyte_sizes
from tests.common import tiny_config

BATCH = 4096


def distinct_fractions(sparse: np.ndarray) -> np.ndarray:
    """Per column: mean over contiguous batches of 4096 of (#distinct ids / 4096)."""
    batches = sparse[: len(sparse) // BATCH * BATCH].reshape(-1, BATCH, sparse.shape[1])
    return np.array([[len(np.unique(b[:, c])) / BATCH for c in range(sparse.shape[1])] for b in batches]).mean(0)


def test_kaggle_profile_matches_the_calibration_table(tmp_path):
    cfg = tiny_config(str(tmp_path), "data.synthetic.profile=kaggle")
    assert table_rows(cfg) == [n for n, _ in KAGGLE_SAMPLE_COLUMNS]  # the model gets the profile's sizes
    data = generate(cfg.data, 48 * BATCH, seed=3)  # enough batches to average the 4-to-12-value columns
    measured = distinct_fractions(data.sparse)
    target = np.array([f for _, f in KAGGLE_SAMPLE_COLUMNS])
    rel = np.abs(measured / target - 1)
    assert rel.max() < 0.10, {f"C{c + 1}": (round(m, 4), t) for c, (m, t) in enumerate(zip(measured, target))
                             if rel[c] >= 0.10}
    assert abs(measured.mean() / 0.2236 - 1) < 0.10  # README's "all 26" row
    assert all((data.sparse[:, c] < n).all() for c, (n, _) in enumerate(KAGGLE_SAMPLE_COLUMNS))
    assert 0.15 < data.labels.mean() < 0.35


@pytest.mark.parametrize("tables, scale", [("v1", 0.001), ("dcnv2", 0.01)])
def test_terabyte_profile_overall_distinct_fraction(tmp_path, tables, scale):
    cfg = tiny_config(str(tmp_path), "data.synthetic.profile=terabyte",
                      f"data.synthetic.terabyte_tables={tables}", f"data.synthetic.scale={scale}")
    sizes = table_rows(cfg)
    full = MLPERF_V1_TABLE_SIZES if tables == "v1" else MLPERF_DCNV2_TABLE_SIZES
    assert sizes == terabyte_sizes(tables, scale)
    assert [s for s, f in zip(sizes, full) if f < 100] == [f for f in full if f < 100]  # small tables whole
    assert max(sizes) == round(max(full) * scale)
    data = generate(cfg.data, 4 * BATCH, seed=4)
    assert abs(distinct_fractions(data.sparse).mean() / 0.16 - 1) < 0.10


def test_expected_distinct_fraction_agrees_with_sampling():
    rng = np.random.default_rng(0)
    for n, s in [(10, 2.0), (5000, 1.0), (300_000, 1.2), (40_000_000, 1.25)]:
        sampled = np.mean([len(np.unique(power_law_ids(rng, n, s, BATCH))) / BATCH for _ in range(10)])
        assert abs(expected_distinct_fraction(n, s) / sampled - 1) < 0.03, (n, s)


def test_custom_profile_keeps_the_given_sizes(tmp_path):
    cfg = tiny_config(str(tmp_path))
    assert table_rows(cfg) == list(cfg.data.table_sizes)
