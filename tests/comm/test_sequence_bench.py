"""scripts/bench_seq_comm.py builds batches at exactly the reference's in-batch unique rates."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_seq_comm.py"
spec = importlib.util.spec_from_file_location("bench_seq_comm", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_ids_have_the_asked_distinct_count_within_the_table():
    rng = np.random.default_rng(0)
    ids = bench.ids_with_unique_rate(10_000, 0.024, 5_000, rng, zipf=1.1)
    assert ids.shape == (10_000,) and len(set(ids.tolist())) == 240
    assert ids.min() >= 0 and ids.max() < 5_000
    # Zipf-skewed repeats: the most frequent id is far above the mean count
    assert np.bincount(ids).max() > 5 * 10_000 / 240


def test_rank_batches_hit_the_reference_rates_per_table():
    args = argparse.Namespace(batch=4, seq_len=512, row_cap=50_000, context_unique=1.0, zipf=1.1, world_size=2)
    counts = bench.ideal_counts(args)
    for table, rate in bench.UNIQUE_RATES.items():
        positions, distinct = counts[table]
        assert abs(distinct / positions - rate) < 1e-3, table
    assert counts["uid"] == (8, 8)  # one per sample, all distinct
