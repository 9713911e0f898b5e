"""comm.dedup_at: source on real Gloo ranks: TorchRec's stock sharded EBC fed the distinct bags
(comm/dedup/source.py) against the same EBC fed the full batch (`none`).

Table-, column- and row-wise (row-wise over Gloo through the even all-gather of
comm/torchrec/), one-hot and multi-hot, one pooled width (the expand in one gather,
torchrec/pooled_source.RowGatherExpandShardedEBC) and two (TorchRec's), in one spawn:
the first forward is bitwise none's (the tables are the same); the losses track none's within float summation
order (rtol 1e-5, as test_dedup_training.py); the lookups (comm/lookups.py) take exactly the
distinct bags of every (sample rank, owner) and their ids, counted independently from the ids.
Beside them owner-side `dedup` and `auto` on the scenarios with column-wise tables: ids sent,
rows looked up and rows sent count in whole rows under every codec (a column-wise table once, not
once per column shard).
"""

from __future__ import annotations

import contextlib
import numpy as np
import pytest
import torch

from tests.comm.ranks import TWO_RANK_MIX, Scenario, Table, bags_for, batch_for, build, to_numpy
from tests.multiproc import run_ranks

LOSS_RTOL = 1e-5

SCENARIOS = {
    "one_hot": Scenario(tables=(
        *TWO_RANK_MIX,
        # both shards on rank 1, beside c's second: rank 1's lookup holds first and later shards
        Table("c2", 12, 16, ("cw", (1, 1))),
        Table("r", 20, 8, ("rw",)),
        Table("e", 10, 8, ("tw", 1), ids="equal"),
    ), batch=16, steps=3, lr=0.5),
    "multi_hot": Scenario(tables=(
        Table("m3", 30, 8, ("tw", 1), bag=3),
        Table("m5", 40, 16, ("cw", (1, 0)), bag=5),
        Table("j", 10, 8, ("tw", 0), ids="jagged"),
        Table("r2", 25, 8, ("rw",), bag=2),
    ), batch=16, steps=3, lr=0.5),
    # pooled widths that differ: TorchRec's own expand (RowGatherExpandShardedEBC gathers one width only)
    "mixed_widths": Scenario(tables=(
        Table("w8", 10, 8, ("tw", 0)),
        Table("w16", 12, 16, ("tw", 1)),
    ), batch=16, steps=2, lr=0.5),
}


MODES = {"one_hot": ("none", "source", "dedup", "auto"), "multi_hot": ("none", "source", "dedup", "auto"),
         "mixed_widths": ("none", "source")}
"""codecs trained per scenario: `source` is comm.dedup_at: source; `dedup` and `auto` the owner's"""


def _train(sc: Scenario, mode: str, rank: int, world_size: int) -> dict:
    from dlrmtrain.comm.dedup.source import row_wise_dists_for_source, source_transform
    from dlrmtrain.comm.lookups import count_lookups
    from dlrmtrain.comm.stats import collect_comm_stats
    from dlrmtrain.comm.stock_bytes import count_stock_dists

    source = mode == "source"
    dmp, dense_opt, counters = build(sc, "none" if source else mode, world_size, source=source)  # SourceDedupEBCSharder
    if source:
        row_wise_dists_for_source(dmp)
    count_stock_dists(dmp, counters, "dedup" if source else "none")
    count_lookups(dmp, counters)
    from tests.comm.sync_counter import HostSyncCounter

    transform = source_transform(dmp) if source else (lambda kjt: kjt)
    out = {"pooled": [], "losses": [], "syncs": []}
    for step in range(sc.steps):
        kjt, labels = batch_for(sc, step, rank)
        kjt = transform(kjt)  # the loader's prefetch thread in a run: not the step's
        # from the second step (the first reads the expand's static order once): the step's host
        # syncs in the codec's own code, the source expand in comm/torchrec/ included (not
        # TorchRec's and fbgemm's variable-batch code it calls: `counter.library`)
        counter = HostSyncCounter(extra_files=("comm/torchrec/",), direct_only=True)
        with counter if step else contextlib.nullcontext():
            dense_opt.zero_grad()
            loss, pooled = dmp(kjt, labels)
            loss.backward()
            dense_opt.step()
        out["syncs"] += counter.syncs
        out.setdefault("library_syncs", []).extend(counter.library)
        out["pooled"].append(pooled)
        out["losses"].append(loss.item())
        out["keys"] = list(dmp.module.last_keys)
    out["stats"] = collect_comm_stats(counters)
    return out


def _both(rank: int, world_size: int) -> dict:
    return to_numpy({(name, mode): _train(sc, mode, rank, world_size)
                     for name, sc in SCENARIOS.items() for mode in MODES[name]})


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(_both, 2, timeout=280)


def expected_lookups(sc: Scenario, rank: int, world_size: int, source: bool) -> tuple[int, int]:
    """(ids, bags) rank `rank`'s lookups take over sc.steps, from the ids with plain Python."""
    ids = bags = 0
    for step in range(sc.steps):
        per_rank = [bags_for(sc, step, s) for s in range(world_size)]
        for t in sc.tables:
            for s in range(world_size):
                theirs = per_rank[s][f"f_{t.name}"]
                sent = [list(b) for b in {tuple(b): None for b in theirs}] if source else theirs
                if t.placement[0] == "rw":  # every rank gets every bag sent, its rows' ids
                    block = -(-t.rows // world_size)
                    bags += len(sent)
                    ids += sum(1 for b in sent for i in b if i // block == rank)
                    continue
                owners = [t.placement[1]] if t.placement[0] == "tw" else list(t.placement[1])
                if rank == min(owners):  # a column-wise table's count once, on its first shard's owner
                    bags += len(sent)
                    ids += sum(len(b) for b in sent)
    return ids, bags


def expected_rows(sc: Scenario, table: Table, distinct: bool) -> int:
    """Rows of a table-/column-wise `table` the output all-to-all carries over sc.steps, all ranks
    together, in whole rows: every sample rank's bags, or its distinct bags (compared whole)."""
    bags = [bags_for(sc, step, s)[f"f_{table.name}"] for step in range(sc.steps) for s in range(2)]
    return sum(len({tuple(b) for b in per_rank}) if distinct else len(per_rank) for per_rank in bags)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_source_forward_is_bitwise_none_and_losses_track_it(results, name):
    for rank, res in enumerate(results):
        none, source = res[name, "none"], res[name, "source"]
        # the first forward (identical tables) bitwise; after that the tables differ by the
        # order the duplicates' gradients were summed in, and so do the forwards, by ulps
        assert np.array_equal(none["pooled"][0], source["pooled"][0]), f"rank {rank}: forward differs"
        for p_none, p_source in zip(none["pooled"][1:], source["pooled"][1:]):
            np.testing.assert_allclose(p_source, p_none, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(source["losses"], none["losses"], rtol=LOSS_RTOL)


@pytest.mark.timeout(300)
def test_source_rows_arrive_in_the_collections_feature_order(results):
    """At the source the one-width expand writes the rows in the batch's feature order, across
    sharding types, so the model views them instead of reordering them (models/dlrm.py
    `_pooled_rows`); TorchRec's outputs come grouped by sharding type (its stock one, under
    `none`, by owner rank too), which the model must reorder."""
    for rank, res in enumerate(results):
        for name in ("one_hot", "multi_hot"):
            features = [f"f_{t.name}" for t in SCENARIOS[name].tables]
            assert res[name, "source"]["keys"] == features, (rank, name)
            assert res[name, "none"]["keys"] != features, (rank, name)  # else this proves nothing


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_source_step_makes_no_codec_host_sync(results, name):
    """Under source the plan is made with the batch; the step's expand (comm/torchrec/pooled_source.py) reads
    nothing back to the host and sizes nothing by the data."""
    for rank, res in enumerate(results):
        assert res[name, "source"]["syncs"] == [], f"rank {rank}: {res[name, 'source']['syncs']}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_source_sends_and_looks_up_only_the_distinct_bags(results, name):
    sc = SCENARIOS[name]
    for rank, res in enumerate(results):
        for mode in MODES[name]:  # the owner's dedup and auto take every bag, as none
            stats = res[name, mode]["stats"]
            ids, bags = expected_lookups(sc, rank, 2, source=mode == "source")
            assert stats["ids_looked_up_per_step"] * sc.steps == ids, (rank, mode)
            assert stats["rows_looked_up_per_step"] * sc.steps == bags, (rank, mode)
            assert stats["ids_sent_per_step"] == stats["ids_looked_up_per_step"]
        # what the output all-to-all carried: one row per bag looked up, fewer under source
        none, source = res[name, "none"]["stats"], res[name, "source"]["stats"]
        assert source["rows_sent_per_step"] < none["rows_sent_per_step"]
        assert source["total"]["payload_fwd_sent_bytes"] < none["total"]["payload_fwd_sent_bytes"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["one_hot", "multi_hot"])
def test_column_wise_tables_count_whole_rows_under_every_codec(results, name):
    """Rows sent, bags and distinct bags per table count a column-wise table's bags once, not once
    per column shard, under none, owner-side dedup, source and auto: rows sent over all ranks are
    every sample rank's bags (none) or its distinct bags (dedup, source; auto: a step of either);
    each rank's bags its batch, its distinct bags what it received."""
    sc = SCENARIOS[name]
    assert any(t.placement[0] == "cw" and len(t.placement[1]) > 1 for t in sc.tables)  # else this proves nothing
    for mode in MODES[name]:
        for t in (t for t in sc.tables if t.placement[0] != "rw"):
            sent = sum(res[name, mode]["stats"]["tables"][t.name]["rows_sent"] for res in results)
            every, distinct = expected_rows(sc, t, False), expected_rows(sc, t, True)
            if mode == "auto":
                assert distinct <= sent <= every, (mode, t.name, sent, distinct, every)
            else:
                assert sent == (every if mode == "none" else distinct), (mode, t.name, sent, every, distinct)
            for rank, res in enumerate(results):
                row = res[name, mode]["stats"]["tables"][t.name]
                mine = [bags_for(sc, step, rank)[f"f_{t.name}"] for step in range(sc.steps)]
                if mode != "source":  # at the source the full batch is not counted (its bags 0)
                    assert row["bags"] == sc.batch * sc.steps, (mode, t.name, rank)
                if mode in ("source", "dedup"):
                    assert row["unique_bags"] == sum(len({tuple(b) for b in m}) for m in mine), (mode, t.name)


def test_bad_ids_end_as_the_loaders_named_error_before_the_plan():
    """An id beyond its table or a negative one: the loader's range check names the table, as
    without source (the plan runs after it, on the prefetch thread)."""
    from dlrmtrain.comm.dedup.source import distinct_bags
    from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
    from dlrmtrain.data.parts import RowBlock

    class Rows:
        name, rows = "bad", 8

        def __init__(self, bad: int) -> None:
            self.bad = bad

        def read(self, start: int, stop: int) -> RowBlock:
            sparse = np.zeros((stop - start, 26), dtype=np.int64)
            sparse[min(3, stop - start - 1), 5] = self.bad
            return RowBlock(np.zeros((stop - start, 13), np.float32), sparse, np.zeros(stop - start, np.float32))

    for bad in (4, -1):
        loader = CriteoBatchLoader([Rows(bad)], CriteoLoaderSpec(8, table_rows=[4] * 26))
        loader.sparse_transform = distinct_bags
        with pytest.raises(ValueError, match=f"table t_cat_5: id {bad} in rows 0..7 is outside its 4 rows"):
            next(iter(loader))
    good = CriteoBatchLoader([Rows(2)], CriteoLoaderSpec(8, table_rows=[4] * 26))
    good.sparse_transform = distinct_bags
    batch = next(iter(good))
    assert batch.sparse_features.stride_per_key_per_rank()[5] == [2]  # ids 0 and 2
    assert torch.equal(batch.sparse_features.inverse_indices()[1][5], torch.tensor([0, 0, 0, 1, 0, 0, 0, 0]))
