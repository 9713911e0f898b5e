"""`none`'s stock counter tallies passes in its hook and counts them when read: the same
figures as counting every pass one by one (comm/stock_bytes.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from dlrmtrain.comm.layout import DistLayout, FeatureEntry, RowWiseLayout
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.comm.stock_bytes import StockDistCounter, count_stock_step

W = 2
ENTRIES = [[FeatureEntry(f"f{r}{i}", f"t{r}{i}", 8 * (i + 1), 100) for i in range(3)] for r in range(W)]
LAYOUTS = {"table_wise": DistLayout(entries_per_rank=ENTRIES),
           "row_wise": RowWiseLayout(entries=ENTRIES[0], block_sizes=[50, 50, 50], world_size=W)}
# (local embedding rows, batch sizes per sample rank or None, dtype): uneven sizes, a
# context without sizes, and a second element size, each more than once
PASSES = [(12, [5, 7], torch.float32), (12, None, torch.float32), (12, [5, 7], torch.float32),
          (8, [4, 4], torch.float16), (12, None, torch.float32), (8, [4, 4], torch.float16)]


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_tallied_passes_count_what_each_pass_counts(kind):
    layout = LAYOUTS[kind]
    counter = StockDistCounter(layout, 1, kind)
    expected = DistCommStats(codec="none", sharding_type=kind)
    for i, (rows, sizes, dtype) in enumerate(PASSES):
        embs = torch.zeros(rows, 4, dtype=dtype)
        counter(None, (embs, SimpleNamespace(batch_size_per_rank=sizes)))
        count_stock_step(expected, layout, 1, sizes or [rows // W] * W, embs.element_size())
        if i == 2:  # a read in between adds the passes so far once, not again later
            assert counter.counted_bytes().steps == 3
    got = counter.counted_bytes()
    assert got.steps == expected.steps == len(PASSES)
    assert {t: dataclasses.asdict(s) for t, s in got.tables.items()} == \
        {t: dataclasses.asdict(s) for t, s in expected.tables.items()}
    assert any(s.uncompressed_fwd_sent_bytes for s in got.tables.values())
