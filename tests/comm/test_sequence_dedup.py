"""dedup on the sequence-embedding all-to-all vs TorchRec's stock one, on real Gloo ranks.

The same EC (DLRMv4's tables, item_id shared by item_id and item_candidate_id,
...) is sharded twice, `none` (TorchRec's `SequenceEmbeddingsAllToAll`,
untouched) and `dedup`, with equal weights and batches of short sequences
with heavy repetition (sequence_ranks.py). Bounds as in test_dedup_training.py:
step 1's forward bitwise equal; gradients differ only in float summation order,
so later outputs, losses and tables track `none` to fp32 rounding. Bytes are
counted independently from the ids: distinct (table, destination rank) rows ×
row bytes.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dlrmtrain.comm.embedding import CodecEmbeddingCollectionSharder
from tests.comm.sequence_ranks import (
    DIM,
    SeqScenario,
    feature_table,
    features,
    make_ec,
    shard,
    sequences_for,
    source_made,
    table_rows,
    train,
)
from tests.multiproc import run_ranks

WORLD = 2
SCENARIOS = {
    "row_wise": SeqScenario(default_type="row_wise"),
    "table_wise": SeqScenario(default_type="table_wise"),
    "row_wise_uneven": SeqScenario(default_type="row_wise", uneven=True),
    # column-wise sequence tables keep TorchRec's dist under dedup, beside the dedup dists (counted as none)
    "mixed": SeqScenario(default_type="table_wise", sharding_tables={"item_id": "row_wise", "album_id": "column_wise"}),
}
DEDUP_DISTS = {"row_wise": 1, "table_wise": 1, "row_wise_uneven": 1, "mixed": 2}
RTOL, ATOL = 1e-5, 1e-6
CODECS = {name: ("none", "dedup") for name in SCENARIOS}
CODECS["mixed"] += ("dedup+fp16",)
CODECS["row_wise"] += ("auto",)
SOURCE = ("table_wise", "row_wise_uneven", "mixed")
"""scenarios also run with comm.dedup_at: source (`dedup`, the loader's distinct ids): codec "source" below"""
for _name in SOURCE:
    CODECS[_name] += ("source",)


def _train(name: str, codec: str, rank: int, world_size: int) -> dict:
    if codec == "source":
        return train(SCENARIOS[name], "dedup", rank, world_size, dedup_at="source")
    return train(SCENARIOS[name], codec, rank, world_size)


def _bad_input(sc: SeqScenario, rank: int, world_size: int, bad: int) -> str:
    dmp, _, _ = shard(sc, "dedup", world_size, dedup_at="source")
    seqs = sequences_for(sc, 0, rank)
    seqs["artist_id"][0][0] = bad  # on every rank: each refuses it before the id all-to-all
    try:  # where the loader makes the batch, before the id all-to-all
        dmp(source_made(dmp)(seqs))
    except ValueError as e:
        return str(e)
    return "ran"


def _all_runs(rank: int, world_size: int) -> dict:
    out = {(name, codec): _train(name, codec, rank, world_size)
           for name in SCENARIOS for codec in CODECS[name]}
    for bad in (table_rows()["artist_id"], -1):
        out[("bad", bad)] = _bad_input(SCENARIOS["row_wise"], rank, world_size, bad)
    try:  # one row-wise all-to-all carries every table: a per-table `none` among them is refused
        shard(SCENARIOS["row_wise"], "dedup", world_size, table_codecs={"uid": "none"})
        out["mixed_codecs_error"] = None
    except ValueError as e:
        out["mixed_codecs_error"] = str(e)
    return out


@pytest.fixture(scope="module")
def runs():
    """One spawned 2-rank group trains every (scenario, codec) (shared by the tests below)."""
    return run_ranks(_all_runs, WORLD, timeout=500)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_dedup_forward_bitwise_equal_to_none(runs, name):
    for rank in range(WORLD):
        none, dedup = runs[rank][(name, "none")], runs[rank][(name, "dedup")]
        for f in features():
            assert np.array_equal(none["outputs"][0][f], dedup["outputs"][0][f]), f"rank {rank} {f}"
            assert none["outputs"][0][f].shape[0] > 0 or f not in ("item_id", "item_candidate_id")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_dedup_training_tracks_none(runs, name):
    for rank in range(WORLD):
        none, dedup = runs[rank][(name, "none")], runs[rank][(name, "dedup")]
        np.testing.assert_allclose(dedup["losses"], none["losses"], rtol=RTOL)
        for step in range(1, SCENARIOS[name].steps):
            for f in features():
                np.testing.assert_allclose(dedup["outputs"][step][f], none["outputs"][step][f],
                                           rtol=RTOL, atol=ATOL, err_msg=f"step {step} rank {rank} {f}")
    for t, w in runs[0][(name, "none")]["tables"].items():
        np.testing.assert_allclose(runs[0][(name, "dedup")]["tables"][t], w, rtol=RTOL, atol=ATOL, err_msg=t)
    # the tables moved: the comparison is not between untouched weights
    initial = make_ec().embeddings["item_id"].weight.detach().numpy()
    assert not np.array_equal(initial, runs[0][(name, "dedup")]["tables"]["item_id"])


def _ids_by_table(sc: SeqScenario, step: int, rank: int) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for f, seqs in sequences_for(sc, step, rank).items():
        out.setdefault(feature_table()[f], set()).update(i for s in seqs for i in s)
    return out


def _positions_by_table(sc: SeqScenario, step: int, rank: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for f, seqs in sequences_for(sc, step, rank).items():
        out[feature_table()[f]] = out.get(feature_table()[f], 0) + sum(len(s) for s in seqs)
    return out


def _column_wise(sc: SeqScenario, table: str) -> bool:
    return sc.sharding_tables.get(table, sc.default_type) == "column_wise"


def _check_column_wise_table(sc: SeqScenario, stats_by_rank: list[dict], t: str) -> None:
    """A column-wise table (one column shard of DIM / WORLD per rank) travels whole under every codec:
    each rank sends its shard's columns of every sample rank's positions and receives every shard's
    of its own; ids, lookups and rows count once per position, on the first shard's rank (0)."""
    positions = [sum(_positions_by_table(sc, step, rank).get(t, 0) for step in range(sc.steps))
                 for rank in range(WORLD)]
    for rank, stats in enumerate(stats_by_rank):
        got = stats["tables"][t]
        assert got["codec"] == "none", (rank, t)
        assert got["payload_fwd_sent_bytes"] == sum(positions) * (DIM // WORLD) * 4, (rank, t)
        assert got["payload_fwd_recv_bytes"] == got["uncompressed_fwd_recv_bytes"] == positions[rank] * DIM * 4
        assert got["bags"] == got["unique_bags"] == positions[rank], (rank, t)
        assert got["rows_sent"] == (sum(positions) if rank == 0 else 0), (rank, t)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_dedup_bytes_are_distinct_rows_per_table_and_destination(runs, name):
    sc = SCENARIOS[name]
    row_bytes = DIM * 4
    sent_total: dict[str, int] = {}
    for rank in range(WORLD):
        tables = runs[rank][(name, "dedup")]["stats"]["tables"]
        assert set(tables) == set(table_rows())  # column-wise ones too: TorchRec's dist, counted
        for t, got in tables.items():
            if _column_wise(sc, t):
                continue  # below
            # the receiver: its distinct ids of t (all features sharing t), whoever owns them
            distinct = sum(len(_ids_by_table(sc, step, rank).get(t, ())) for step in range(sc.steps))
            positions = sum(_positions_by_table(sc, step, rank).get(t, 0) for step in range(sc.steps))
            assert got["payload_fwd_recv_bytes"] == distinct * row_bytes, (rank, t)
            assert got["payload_bwd_sent_bytes"] == distinct * row_bytes, (rank, t)
            assert got["uncompressed_fwd_recv_bytes"] == positions * row_bytes, (rank, t)
            assert got["bags"] == positions and got["unique_bags"] == distinct
            sent_total[t] = sent_total.get(t, 0) + got["payload_fwd_sent_bytes"]
            if sc.sharding_tables.get(t, sc.default_type) == "row_wise":
                # owner `rank` sends each sample rank the distinct ids in its row block
                block = -(-table_rows()[t] // WORLD)
                sent = sum(len({i for i in _ids_by_table(sc, step, s).get(t, ()) if i // block == rank})
                           for step in range(sc.steps) for s in range(WORLD))
                assert got["payload_fwd_sent_bytes"] == sent * row_bytes, (rank, t)
    for t, sent in sent_total.items():  # every row sent is received
        assert sent == sum(runs[r][(name, "dedup")]["stats"]["tables"][t]["payload_fwd_recv_bytes"]
                           for r in range(WORLD)), t
    for t in filter(lambda t: _column_wise(sc, t), table_rows()):  # TorchRec's dist, every position
        for codec in ("none", "dedup"):
            _check_column_wise_table(sc, [runs[r][(name, codec)]["stats"] for r in range(WORLD)], t)
    # none: TorchRec's untouched dist, counted around it: every position, = dedup's `uncompressed`
    for rank in range(WORLD):
        none, dedup = runs[rank][(name, "none")]["stats"], runs[rank][(name, "dedup")]["stats"]
        assert set(none["tables"]) == set(dedup["tables"]) and none["codecs"] == ["none"]
        for t, got in none["tables"].items():
            assert got["payload_fwd_recv_bytes"] == dedup["tables"][t]["uncompressed_fwd_recv_bytes"], (rank, t)
            assert got["payload_fwd_sent_bytes"] == dedup["tables"][t]["uncompressed_fwd_sent_bytes"], (rank, t)
    ratio = runs[0][(name, "dedup")]["stats"]["payload_ratio_vs_none"]
    assert ratio is not None and ratio > 1.5  # repetition: fewer rows than positions (per-sample features too)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_one_host_sync_per_dedup_dist_per_step(runs, name):
    for rank in range(WORLD):
        dedup = runs[rank][(name, "dedup")]
        assert dedup["codec_dists"] == DEDUP_DISTS[name]
        assert [fn for fn, _ in dedup["syncs"]] == ["tolist"] * DEDUP_DISTS[name], dedup["syncs"]
        assert runs[rank][(name, "none")]["codec_dists"] == 0


def test_dedup_fp16_halves_dedup_bytes_and_is_labelled_lossy(runs):
    for rank in range(WORLD):
        lossless, lossy = runs[rank][("mixed", "dedup")], runs[rank][("mixed", "dedup+fp16")]
        assert lossy["stats"]["lossy_codecs"] == ["dedup+fp16"] and lossless["stats"]["lossy_codecs"] == []
        for t, row in lossy["stats"]["tables"].items():  # a column-wise table travels whole (none)
            halved = 1 if row["codec"] == "none" else 2
            assert halved * row["payload_fwd_recv_bytes"] == lossless["stats"]["tables"][t]["payload_fwd_recv_bytes"]
        none = runs[rank][("mixed", "none")]
        for f in features():  # rounded to fp16 on the wire: close, not equal
            np.testing.assert_allclose(lossy["outputs"][0][f], none["outputs"][0][f], rtol=1e-3, atol=1e-3)


def test_codecs_mixed_inside_one_all_to_all_are_refused(runs):
    for rank in range(WORLD):
        assert "comm.table_codecs: row_wise sequence tables" in runs[rank]["mixed_codecs_error"]
        assert "['dedup', 'none']" in runs[rank]["mixed_codecs_error"]


def test_auto_runs_both_paths_and_trains_like_none(runs):
    """auto's first steps alternate dedup and none (its probe): both lossless, both counted."""
    sc = SCENARIOS["row_wise"]
    for rank in range(WORLD):
        none, auto = runs[rank][("row_wise", "none")], runs[rank][("row_wise", "auto")]
        for f in features():
            assert np.array_equal(none["outputs"][0][f], auto["outputs"][0][f]), f"rank {rank} {f}"
        np.testing.assert_allclose(auto["losses"], none["losses"], rtol=RTOL)
        assert auto["stats"]["codecs"] == ["auto:dedup"] and auto["codec_dists"] == 1
        for t, got in auto["stats"]["tables"].items():
            positions = [_positions_by_table(sc, step, rank).get(t, 0) for step in range(sc.steps)]
            distinct = [len(_ids_by_table(sc, step, rank).get(t, ())) for step in range(sc.steps)]
            assert got["uncompressed_fwd_recv_bytes"] == sum(positions) * DIM * 4
            # each step moved its distinct rows (dedup) or every position (none), and both paths ran
            options = {sum(d if use else p for use, d, p in zip(choice, distinct, positions))
                       for choice in itertools.product((True, False), repeat=sc.steps) if len(set(choice)) == 2}
            assert got["payload_fwd_recv_bytes"] // (DIM * 4) in options, t


def test_none_keeps_torchrec_sharder():
    from torchrec.distributed.embedding import EmbeddingCollectionSharder

    assert type(CodecEmbeddingCollectionSharder.for_codecs("none", {}, {})) is EmbeddingCollectionSharder
    with pytest.raises(ValueError, match="comm.codec: unknown codec"):
        CodecEmbeddingCollectionSharder.for_codecs("dedupp", {}, {})


# ------------------------------------------------ comm.dedup_at: source (the loader's distinct ids)
@pytest.mark.parametrize("name", SOURCE)
def test_source_dedup_forward_is_bitwise_none_and_training_tracks_it(runs, name):
    for rank in range(WORLD):
        none, source = runs[rank][(name, "none")], runs[rank][(name, "source")]
        for f in features():
            assert np.array_equal(none["outputs"][0][f], source["outputs"][0][f]), f"rank {rank} {f}"
        np.testing.assert_allclose(source["losses"], none["losses"], rtol=RTOL)
        for step in range(1, SCENARIOS[name].steps):
            for f in features():
                np.testing.assert_allclose(source["outputs"][step][f], none["outputs"][step][f],
                                           rtol=RTOL, atol=ATOL, err_msg=f"step {step} rank {rank} {f}")
        assert source["codec_dists"] == 0 and source["syncs"] == none["syncs"]  # TorchRec's own dists
        # column-wise tables travel whole at the source: counted as `none`
        whole = any(_column_wise(SCENARIOS[name], t) for t in table_rows())
        assert source["stats"]["codecs"] == (["dedup", "none"] if whole else ["dedup"])
    for t, w in runs[0][(name, "none")]["tables"].items():
        np.testing.assert_allclose(runs[0][(name, "source")]["tables"][t], w, rtol=RTOL, atol=ATOL, err_msg=t)


@pytest.mark.parametrize("name", SOURCE)
def test_source_dedup_sends_and_looks_up_each_distinct_id_once(runs, name):
    """ids sent: each table's distinct ids per sample rank (row-wise: split over the owners, so
    per (sample rank, owner, table)); each is looked up and its row sent once. Owner-side dedup
    sends every position and looks each up, and sends the same distinct rows back. A column-wise
    table travels whole under each: every position, counted once (not once per column shard)."""
    sc = SCENARIOS[name]
    totals = {codec: dict.fromkeys(("ids_sent", "rows_looked_up", "rows_sent"), 0)
              for codec in ("none", "dedup", "source")}
    crossing_all = positions_all = 0
    for rank in range(WORLD):
        positions = {t: sum(_positions_by_table(sc, step, rank).get(t, 0) for step in range(sc.steps))
                     for t in table_rows()}
        # what crosses at the source: each table's distinct ids; a column-wise table's every position
        crossing = {t: positions[t] if _column_wise(sc, t) else
                    sum(len(_ids_by_table(sc, step, rank).get(t, ())) for step in range(sc.steps))
                    for t in table_rows()}
        crossing_all += sum(crossing.values())
        positions_all += sum(positions.values())
        for codec, total in totals.items():
            stats = runs[rank][(name, codec)]["stats"]
            assert {t: r["bags"] for t, r in stats["tables"].items()} == positions, codec  # what `none` moves
            for key in total:  # ids are counted where they arrive: summed over the ranks below
                total[key] += round(stats[f"{key}_per_step"] * sc.steps)
        # the rows this rank received: one per id it sent, per table
        assert {t: r["unique_bags"] for t, r in runs[rank][(name, "source")]["stats"]["tables"].items()} == crossing
    for t in filter(lambda t: _column_wise(sc, t), table_rows()):
        _check_column_wise_table(sc, [runs[r][(name, "source")]["stats"] for r in range(WORLD)], t)
    assert totals["source"] == dict.fromkeys(totals["source"], crossing_all)
    assert totals["dedup"] == {"ids_sent": positions_all, "rows_looked_up": positions_all, "rows_sent": crossing_all}
    assert totals["none"] == dict.fromkeys(totals["none"], positions_all) and positions_all > crossing_all


def test_source_dedup_refuses_an_id_outside_its_table_on_each_rank(runs):
    rows = table_rows()["artist_id"]
    for rank in range(WORLD):
        for bad in (rows, -1):
            msg = runs[rank][("bad", bad)]
            assert f"id {bad} of feature" in msg and f"outside its table's {rows} rows" in msg, msg


@pytest.mark.parametrize("codec,table_codecs,hierarchy,key", [
    ("auto", {"uid": "dedup"}, "flat", "comm.table_codecs.uid"), ("dedup+fp16", {}, "flat", "comm.codec: dedup"),
    ("none", {}, "flat", "comm.codec: dedup"), ("dedup", {"uid": "none"}, "flat", "comm.table_codecs.uid"),
    ("dedup", {}, "node", "comm.hierarchy: flat")])
def test_source_dedup_refuses_what_it_does_not_build_naming_the_key(codec, table_codecs, hierarchy, key):
    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.config.schema import CommConfig

    with pytest.raises(ValueError, match="comm.dedup_at: source") as e:
        Placement(CommConfig(codec=codec, table_codecs=table_codecs, hierarchy=hierarchy, dedup_at="source"),
                  "sequence")
    assert key in str(e.value)
