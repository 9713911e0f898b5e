"""`none`'s stock counter tallies passes in its hook and counts them when read: the same
figures as counting every pass one by one (comm/stock_bytes.py). Both counters count a
column-wise table's bytes per shard and its rows once (per bag; sequence: per position)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.layout import DistLayout, FeatureEntry, RowWiseLayout, sequence_layout_of
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.comm.stock_bytes import SequenceStockCounter, StockDistCounter, count_stock_step

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


def test_a_column_wise_sequence_table_counts_each_shards_bytes_and_each_position_once():
    """Table A (features a, c; dim 8) in 4 column shards of width 2, two on each rank, and table
    B (feature b; dim 2) in one shard on rank 1: rank 0 sends its two shards of every position of
    a and c, and only its first shard's count as ids, lookups and rows."""
    def entry(feature, table):
        return FeatureEntry(feature, table, 2, 10)

    shard = [entry("a", "A"), entry("c", "A")]
    layout = sequence_layout_of(DistLayout([shard * 2, shard * 2 + [entry("b", "B")]]), rank=0)
    assert layout.tables == ["A", "B"] and layout.owner_first_shard == [True, True, False, False]
    assert layout.sample_first_shard == [True, True] + [False] * 6 + [True]
    counter = SequenceStockCounter(layout, "column_wise")
    # this rank's batch of 2 (a: 3 positions, c: 1, b: 2), each feature once per shard that reads it
    sample = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "c"] * 4 + ["b"], values=torch.zeros(4 * 4 + 2, dtype=torch.int64),
        lengths=torch.tensor([2, 1, 1, 0] * 4 + [1, 1]))
    # rank 0's 4 features (2 shards of a and c) from both sample ranks (batches 2 and 3):
    # a: 3 + 4 positions, c: 1 + 2
    owner = torch.tensor([[2, 1, 1, 2, 1], [1, 0, 0, 1, 1]] * 2)
    for _ in range(2):
        counter(None, (torch.zeros(14, 2), SimpleNamespace(lengths_after_input_dist=owner,
                                                           features_before_input_dist=sample)))
    got = counter.counted_bytes()
    a, b = got.tables["A"], got.tables["B"]
    assert got.steps == 2 and got.ids_looked_up == got.rows_looked_up == 2 * 10  # a's 7 and c's 3
    assert a.rows_sent == 2 * 10 and a.payload_fwd_sent_bytes == 2 * (2 * 10) * 2 * 4  # 2 shards of width 2
    assert a.bags == a.unique_bags == 2 * 4  # this rank's positions of a and c, once
    assert a.payload_fwd_recv_bytes == a.uncompressed_fwd_recv_bytes == 2 * 4 * 8 * 4  # full rows of dim 8
    assert (b.rows_sent, b.payload_fwd_sent_bytes, b.bags, b.payload_fwd_recv_bytes) == (0, 0, 4, 4 * 2 * 4)


def test_a_column_wise_pooled_table_counts_each_shards_bytes_and_each_bag_once():
    """Table A (dim 8) in 4 column shards of width 2: one on rank 0, three on rank 1 (beside table
    B, dim 2, whole on rank 1). Each shard sends its width of every bag; rows sent, bags and
    distinct bags count A's bags once, on its first shard's rank (0), as B's on its own."""
    a, b = FeatureEntry("a", "A", 2, 10), FeatureEntry("b", "B", 2, 10)
    layout = DistLayout([[a], [a, b, a, a]])
    assert layout.first_shard == [[True], [False, True, False, False]]
    sizes = [3, 5]  # bags per sample rank
    per_rank = [DistCommStats(codec="none", sharding_type="column_wise") for _ in range(W)]
    for rank, stats in enumerate(per_rank):
        count_stock_step(stats, layout, rank, sizes, 4)
    A = [s.tables["A"] for s in per_rank]
    assert [t.rows_sent for t in A] == [sum(sizes), 0]  # 8 bags in all, once
    assert [t.payload_fwd_sent_bytes for t in A] == [sum(sizes) * 2 * 4, 3 * sum(sizes) * 2 * 4]  # every shard's
    assert [(t.bags, t.unique_bags) for t in A] == [(3, 3), (5, 5)]  # each sample rank's own bags
    assert [t.payload_fwd_recv_bytes for t in A] == [3 * 8 * 4, 5 * 8 * 4]  # full rows of dim 8
    assert [(s.tables["B"].rows_sent, s.tables["B"].bags) for s in per_rank] == [(0, 3), (sum(sizes), 5)]
