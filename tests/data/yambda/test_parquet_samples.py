"""Yambda parquet → preprocessing → samples, on a hand-built dataset (pyarrow: the `yambda` extra)."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from dlrmtrain.data.yambda.parquet import require_pyarrow

D = 86_400
T_MAX = 10 * D            # train [7d - 1800, 9d - 1800), gap, test [9d, 10d) with train_days=2
# (uid, timestamp, item, event_type, played_ratio_pct, is_organic); None ratio = not a listen
TRAIN = [
    (0, 7 * D, 1, "listen", 80, 1), (0, 7 * D + 100, 2, "listen", 20, 0), (0, 7 * D + 200, 3, "like", None, 1),
    (0, 7 * D + 3000, 1, "listen", 60, 1), (0, 7 * D + 3100, 4, "dislike", None, 0),
    (0, 7 * D + 3200, 5, "listen", 30, 1), (0, 8 * D + 10, 9, "listen", 90, 0), (0, 8 * D + 50, 2, "listen", 50, 1),
    (1, 7 * D + 500, 6, "listen", 100, 0), (1, 7 * D + 600, 7, "listen", 10, 0), (1, 7 * D + 700, 6, "listen", 70, 1),
    (1, 8 * D + 5000, 8, "like", None, 0), (1, 8 * D + 6000, 0, "listen", 55, 1),
]
OTHER = [
    (0, 7 * D - 2000, 3, "listen", 90, 1),   # before the training window
    (1, 9 * D - 100, 3, "listen", 90, 1),    # in the gap
    (0, 9 * D + 10, 4, "listen", 40, 0),     # test
    (2, 9 * D + 20, 5, "listen", 40, 0),     # test, but user 2 never trained: dropped
    (1, T_MAX, 6, "listen", 90, 0),          # the last event: sets the split, in no window
]
ARTIST = {i: 10 + i // 2 for i in range(10)}
ALBUM = {i: 50 + i % 5 for i in range(10)}


def write_dataset(tmp_path, seed=0):
    from dlrmtrain.data.yambda.parquet import write_parquet
    pytest.importorskip("pyarrow", reason="the yambda extra (pyarrow) is not installed")
    import pyarrow as pa
    rows = TRAIN + OTHER
    order = np.random.default_rng(seed).permutation(len(rows))      # file order is not sorted
    rows = [rows[i] for i in order]
    write_parquet(tmp_path / "multi_event.parquet", {
        "uid": pa.array([r[0] for r in rows], pa.uint32()),
        "timestamp": pa.array([r[1] for r in rows], pa.uint32()),
        "item_id": pa.array([r[2] for r in rows], pa.uint32()),
        "is_organic": pa.array([r[5] for r in rows], pa.uint8()),
        "event_type": pa.array([r[3] for r in rows]).dictionary_encode(),
        "played_ratio_pct": pa.array([r[4] for r in rows], pa.uint16()),
        "track_length_seconds": pa.array([180] * len(rows), pa.uint32())})
    write_parquet(tmp_path / "artist_item_mapping.parquet",
                  {"item_id": list(ARTIST), "artist_id": list(ARTIST.values())})
    write_parquet(tmp_path / "album_item_mapping.parquet", {"item_id": list(ALBUM), "album_id": list(ALBUM.values())})


def prepare(tmp_path, **kw):
    from dlrmtrain.data.yambda.preprocess import preprocess_yambda
    write_dataset(tmp_path)
    return preprocess_yambda(tmp_path / "multi_event.parquet", tmp_path / "artist_item_mapping.parquet",
                             tmp_path / "album_item_mapping.parquet", tmp_path / "prep", train_days=2, **kw)


def test_a_missing_pyarrow_says_how_to_install_it(monkeypatch):
    real_import = builtins.__import__

    def no_pyarrow(name, *a, **k):
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ImportError, match=r"pip install 'dlrmtrain\[yambda\]'"):
        require_pyarrow()


def test_preprocessing_splits_sorts_and_sessions(tmp_path):
    meta = prepare(tmp_path, bucket_events=4, batch_rows=3)      # several buckets and record batches
    from dlrmtrain.data.yambda.store import EventStore
    st = EventStore(tmp_path / "prep")
    want = sorted(TRAIN, key=lambda r: (r[0], r[1]))
    ev = st.events
    assert ev["uid"].tolist() == [r[0] for r in want] and ev["timestamp"].tolist() == [r[1] for r in want]
    assert ev["item_id"].tolist() == [r[2] for r in want]
    assert ev["event_type"].tolist() == [{"listen": 0, "like": 1, "dislike": 2}[r[3]] for r in want]
    assert ev["played_ratio_pct"].tolist() == [r[4] or 0 for r in want]          # null -> 0
    assert ev["session_id"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 0, 0, 0, 1, 1]
    assert st.user_start.tolist() == [0, 8, -1] and st.user_end.tolist() == [8, 13, -1]   # uid 2: test only
    assert (meta["num_events"], meta["num_test_events"], meta["num_users"]) == (13, 1, 2)
    assert (meta["train_start"], meta["train_end"], meta["test_start"]) == (7 * D - 1800, 9 * D - 1800, 9 * D)
    popularity = np.load(tmp_path / "prep" / "item_popularity.npy")
    assert popularity.tolist() == [1, 2, 2, 1, 1, 1, 2, 1, 1, 1]               # every train event counts
    test = np.load(tmp_path / "prep" / "test_events.npz")
    assert test["uid"].tolist() == [0] and test["timestamp"].tolist() == [9 * D + 10]
    assert st.item_to_artist.tolist() == [ARTIST[i] for i in range(10)]
    # the same store from one bucket and one record batch, through the command line
    from dlrmtrain.data.yambda.preprocess import main
    main(["--events", str(tmp_path / "multi_event.parquet"), "--out", str(tmp_path / "cli"), "--train-days", "2",
          "--artists", str(tmp_path / "artist_item_mapping.parquet"),
          "--albums", str(tmp_path / "album_item_mapping.parquet")])
    assert EventStore(tmp_path / "cli").events["item_id"].tolist() == ev["item_id"].tolist()


def test_samples_match_the_hand_built_histories(tmp_path):
    from dlrmtrain.data.yambda.cross_hash import cross_ids
    from dlrmtrain.data.yambda.history import HistoryRule
    from dlrmtrain.data.yambda.samples import SampleRule, YambdaSamples
    from dlrmtrain.sequence_features import CROSS_SPECS
    prepare(tmp_path)
    rule = SampleRule(HistoryRule(history_length=6, scan_window=100), min_history=2, max_seq_len=4096)
    s = YambdaSamples(tmp_path / "prep", rule, CROSS_SPECS)
    assert s.anchors.tolist() == [3, 5, 6, 7, 10, 12]      # listens with >= 2 earlier events of their user
    assert s.t_min == 7 * D + 700 and s.num_windows == 2
    assert s.window_indices(0).tolist() == [0, 1, 2, 3, 4] and s.window_indices(1).tolist() == [5]

    c = s.columns(np.array([3, 0]))                       # anchors at flat 7 and flat 3
    assert c.history_lengths.tolist() == [5, 3]
    # flat 7 (user 0, item 2, ratio 50): 2 per pool from flat 0..6: lp 3,6; like 2; skip 1,5
    assert c.history["item_id"].tolist() == [2, 3, 1, 5, 9] + [1, 2, 3]
    assert c.history["action_weight"].tolist() == [4, 2, 1, 4, 1] + [1, 4, 2]
    assert c.history["artist_id"].tolist() == [ARTIST[i] for i in [2, 3, 1, 5, 9, 1, 2, 3]]
    assert c.history["album_id"].tolist() == [ALBUM[i] for i in [2, 3, 1, 5, 9, 1, 2, 3]]
    assert c.history["action_timestamp"].tolist() == [7 * D + 100, 7 * D + 200, 7 * D + 3000, 7 * D + 3200,
                                                      8 * D + 10, 7 * D, 7 * D + 100, 7 * D + 200]
    cand = c.candidate
    assert cand["item_candidate_id"].tolist() == [2, 1]
    assert cand["item_action_weight"].tolist() == [1, 1]            # ratio 50 and 60: listen_plus
    assert cand["item_query_time"].tolist() == [8 * D + 10, 7 * D + 200]   # last history event
    assert cand["item_candidate_artist_id"].tolist() == [ARTIST[2], ARTIST[1]]
    anchor = {"uid": np.array([0, 0]), "item_id": np.array([2, 1]), "artist_id": np.array([ARTIST[2], ARTIST[1]]),
              "album_id": np.array([ALBUM[2], ALBUM[1]]), "is_organic": np.array([1, 1]),
              "hour_of_day": np.array([0, (7 * D + 3000) // 3600 % 24])}
    for name, keys, rows, salt in CROSS_SPECS:
        assert c.crosses[name].tolist() == cross_ids(anchor, keys, rows, salt).tolist(), name
    skip = s.columns(np.array([1]))                               # flat 5: ratio 30, a skip
    assert skip.candidate["item_action_weight"].tolist() == [0]

    # the model's sequence budget keeps the newest events: 12 - 1 candidate - 8 contextual = 3
    tight = YambdaSamples(tmp_path / "prep", SampleRule(rule.history, 2, max_seq_len=12), CROSS_SPECS)
    assert tight.columns(np.array([3])).history["item_id"].tolist() == [1, 5, 9]
    last_n = SampleRule(HistoryRule(history_length=3, scan_window=100, strategy="last_n"), 2)
    got = YambdaSamples(tmp_path / "prep", last_n, CROSS_SPECS).columns(np.array([3])).history["item_id"]
    assert got.tolist() == [1, 5, 9]                              # flats 3, 5, 6 (4: dislike, no pool)


def test_holdout_and_the_builder_stream_round_robin(tmp_path):
    from dlrmtrain.config.schema import Config
    from dlrmtrain.data.yambda import build_yambda_loaders
    prepare(tmp_path)
    cfg = Config()
    y = cfg.data.yambda
    cfg.data.source, y.path, y.min_history, y.history_length, y.max_seq_len = \
        "yambda", str(tmp_path / "prep"), 2, 6, 64
    y.prefetch_batches = 0
    y.start_window, y.num_train_windows, y.eval_window = 0, 1, 1
    ranks = [build_yambda_loaders(cfg.data, r, 2, global_batch_size=4, eval_global_batch_size=2) for r in (0, 1)]
    # window 0 has anchors 0..4: one global batch of 4 (the fifth dropped, as the reference)
    assert [loaders.train.num_batches for loaders in ranks] == [1, 1]
    assert ranks[0].train.rank_sample_ids(0)[0].tolist() == [0, 2] and \
        ranks[1].train.rank_sample_ids(0)[0].tolist() == [1, 3]
    batch = next(ranks[0].train.batches_from(0))
    assert batch.uih["item_id"].lengths().tolist() == [3, 5]      # flat 3: 3 events; flat 6: 5 (2 per pool)
    assert ranks[0].table_rows["item_id"] == 10 and ranks[0].table_rows["uid"] == 3
    # eval window 1 = anchor 5 only: rank 0 gets it, rank 1 a weight-0 pad
    evals = [list(loaders.eval.iter_weighted()) for loaders in ranks]
    assert [w.tolist() for _b, w in evals[0]] == [[1.0]] and [w.tolist() for _b, w in evals[1]] == [[0.0]]

    from dlrmtrain.data.yambda.samples import SampleRule, YambdaSamples
    from dlrmtrain.data.yambda.cross_hash import unit_hash
    held = YambdaSamples(tmp_path / "prep", SampleRule(min_history=2, train_fraction=0.5), [])
    h = unit_hash(np.array([0, 1]), 0) >= 0.5                      # which of users 0 and 1 is held out
    uid_of = np.array([0, 0, 0, 0, 1, 1])
    assert held.train_indices(0).tolist() == [i for i in range(5) if not h[uid_of[i]]]
    assert held.eval_indices(0, 2).tolist() == [i for i in range(6) if h[uid_of[i]]]
    assert held.train_window_sizes(range(3)) == [len(held.train_indices(w)) for w in range(3)]
    y.train_fraction, y.num_train_windows = 0.5, 2
    lazy = build_yambda_loaders(cfg.data, 0, 1, 1, 1).train                # windows fetched on demand
    assert lazy.windows.sizes == held.train_window_sizes(range(2))
    assert [lazy.rank_sample_ids(p)[0].tolist() for p in range(lazy.num_batches)] == \
        [[i] for w in range(2) for i in held.train_indices(w).tolist()]


@pytest.mark.parametrize("column, values, message", [
    ("event_type", [0, 1, 7], r"column event_type has unknown code\(s\) \[7\]"),
    ("event_type", ["listen", "skip", "like"], r"event_type has unknown value\(s\) \['skip'\]"),
    ("uid", ["a", "b", "c"], r"column uid holds string values, expected integers"),
    ("played_ratio_pct", ["1", "2", "3"], r"column played_ratio_pct holds string values, "
                                          r"expected numbers"),
])
def test_bad_event_codes_and_column_types_are_errors_naming_file_and_column(tmp_path, column,
                                                                             values, message):
    """Issue 29: integer event_type codes were cast to uint8 unchecked (an unknown code went
    through), and a column of the wrong type failed in numpy without the file or column."""
    from dlrmtrain.data.yambda.parquet import iter_event_batches, write_parquet
    pa = pytest.importorskip("pyarrow", reason="the yambda extra (pyarrow) is not installed")
    columns = {"uid": pa.array([0, 1, 2], pa.uint32()), "timestamp": pa.array([1, 2, 3], pa.uint32()),
               "item_id": pa.array([1, 2, 3], pa.uint32()), "is_organic": pa.array([0, 1, 0], pa.uint8()),
               "event_type": pa.array(["listen"] * 3), "played_ratio_pct": pa.array([50, 60, 70])}
    columns[column] = pa.array(values)
    path = tmp_path / "multi_event.parquet"
    write_parquet(path, columns)
    with pytest.raises(ValueError, match=f"{path}: .*{message}"):
        list(iter_event_batches(path))
