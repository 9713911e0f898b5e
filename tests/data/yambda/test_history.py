"""Anchors, histories, sessions and the split on hand-built event sequences."""

from __future__ import annotations

import numpy as np
import pytest

from dlrmtrain.data.yambda.events import (TemporalSplit, action_bits, encode_event_types, pool_flags,
                                          session_ids)
from dlrmtrain.data.yambda.history import HistoryRule, anchor_positions, uih_budget, user_runs

# One user's events, oldest first: L = listen (ratio in the name), K = like, D = dislike.
#            0      1      2     3      4      5     6      7      8      9
KINDS = ["L90", "L10", "K", "L70", "D", "L20", "K", "L55", "L49", "L100"]


def events(kinds):
    types = np.array([0 if k[0] == "L" else 1 if k == "K" else 2 for k in kinds], dtype=np.uint8)
    ratio = np.array([float(k[1:]) if k[0] == "L" else np.nan for k in kinds], dtype=np.float32)
    return types, ratio


def test_pools_and_action_bits():
    lp, like, skip = pool_flags(*events(KINDS))
    assert np.flatnonzero(lp).tolist() == [0, 3, 7, 9]            # listens with ratio >= 50
    assert np.flatnonzero(skip).tolist() == [1, 5, 8]             # listens under 50 (49 is a skip)
    assert np.flatnonzero(like).tolist() == [2, 6]
    assert action_bits(lp, like, skip).tolist() == [1, 4, 2, 1, 0, 4, 2, 1, 4, 1]   # dislike: no bit


def test_event_type_strings_encode_as_the_reference():
    assert encode_event_types(np.array(["listen", "like", "dislike", "unlike", "undislike"])).tolist() == \
        [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="unknown value.*'skip'"):
        encode_event_types(np.array(["listen", "skip"]))


def test_anchors_are_listens_with_enough_earlier_events_of_their_user():
    # user 7: KINDS (10 events); user 9: three listens
    types, _ = events(KINDS + ["L80", "L80", "L80"])
    uid = np.array([7] * 10 + [9] * 3)
    assert anchor_positions(uid, types, min_history=4).tolist() == [5, 7, 8, 9]     # 4 (dislike), 6 (like) never
    assert anchor_positions(uid, types, min_history=2).tolist() == [3, 5, 7, 8, 9, 12]  # counts restart per user
    assert anchor_positions(uid, types, min_history=0).tolist() == [0, 1, 3, 5, 7, 8, 9, 10, 11, 12]
    assert [s.tolist() for s in user_runs(uid)] == [[0, 10], [10, 13]]


def test_interleaved_history_takes_the_last_of_each_pool_in_time_order():
    lp, like, skip = pool_flags(*events(KINDS))
    rule = HistoryRule(history_length=6, scan_window=100, strategy="interleaved")   # 2 per pool
    lo, hi = rule.scan_range(flat_pos=9, user_start=0)
    assert (lo, hi) == (0, 9)                                      # the anchor itself is not history
    picked = rule.select(lp[lo:hi], like[lo:hi], skip[lo:hi]) + lo
    # lp before 9: 0,3,7 -> 3,7; like: 2,6; skip: 1,5,8 -> 5,8; merged by position
    assert picked.tolist() == [2, 3, 5, 6, 7, 8]


def test_last_n_history_and_the_scan_window():
    lp, like, skip = pool_flags(*events(KINDS))
    rule = HistoryRule(history_length=4, scan_window=100, strategy="last_n")
    assert rule.select(lp[:9], like[:9], skip[:9]).tolist() == [5, 6, 7, 8]   # 4 (dislike) skipped
    short = HistoryRule(history_length=4, scan_window=3, strategy="last_n")
    lo, hi = short.scan_range(9, 0)
    assert (lo, hi) == (6, 9)
    assert (short.select(lp[lo:hi], like[lo:hi], skip[lo:hi]) + lo).tolist() == [6, 7, 8]
    assert HistoryRule(scan_window=50).scan_range(12, user_start=10) == (10, 12)  # never before the user


def test_uih_budget_is_the_references():
    assert uih_budget(4096, 1, 8) == 4087
    assert 3 * (4086 // 3) + 8 + 1 == 4095                          # yambda_5b.gin: no truncation at 4086


def test_sessions_restart_per_user_and_after_long_silences():
    uid = np.array([1, 1, 1, 1, 2, 2, 2])
    ts = np.array([0, 100, 2000, 3800, 5000, 5100, 9000])
    assert session_ids(uid, ts, gap_seconds=1800).tolist() == [0, 0, 1, 1, 0, 0, 1]   # 1800 exactly: same


def test_the_temporal_split_counts_back_from_the_last_event():
    s = TemporalSplit.from_last_timestamp(t_max=1_000_000, train_days=3, gap_minutes=30, test_days=1)
    assert (s.test_end, s.test_start) == (1_000_000, 1_000_000 - 86_400)
    assert s.train_end == s.test_start - 1800 and s.train_start == s.train_end - 3 * 86_400
    ts = np.array([s.train_start - 1, s.train_start, s.train_end - 1, s.train_end, s.test_start, s.test_end])
    assert s.is_train(ts).tolist() == [False, True, True, False, False, False]
    assert s.is_test(ts).tolist() == [False, False, False, False, True, False]   # t_max itself excluded
