"""Yambda's events as the reference encodes them: event types, the three behaviour pools,
the temporal train / gap / test split and the sessions.

Mirrors mlcommons/training recommendation_v4 (PR #889): `dlrm_v4/preprocess_public_data.py`
(`EVENT_TYPE_MAP`, `_split_boundaries`, `_temporal_split`, `_build_sessions`) and
`dlrm_v4/datasets/yambda.py` (`LISTEN_PLUS_THRESHOLD`, the LP / LIKE / SKIP bits).
Pure numpy on event columns; no file format here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EVENT_TYPE_MAP: dict[str, int] = {"listen": 0, "like": 1, "dislike": 2, "unlike": 3, "undislike": 4}
"""Raw `event_type` string → the uint8 code the reference stores."""
LISTEN_TYPE = EVENT_TYPE_MAP["listen"]
LIKE_TYPE = EVENT_TYPE_MAP["like"]
LISTEN_PLUS_THRESHOLD = 50
"""A listen is listen_plus when played_ratio_pct >= 50, else a skip."""

LP_BIT, LIKE_BIT, SKIP_BIT = 1, 2, 4
"""action_weight bits of the three pools (the model's action_weights [1, 2, 4])."""

SECONDS_PER_DAY = 86_400


def encode_event_types(raw: np.ndarray) -> np.ndarray:
    """uint8 codes of an `event_type` column: strings via EVENT_TYPE_MAP, integers kept."""
    raw = np.asarray(raw)
    if raw.dtype.kind in "iu":
        return raw.astype(np.uint8)
    out = np.empty(raw.shape, dtype=np.uint8)
    names = raw.astype(str)
    known = np.zeros(raw.shape, dtype=bool)
    for name, code in EVENT_TYPE_MAP.items():
        hit = names == name
        out[hit], known[hit] = code, True
    if not known.all():
        bad = sorted(set(names[~known].tolist()))[:5]
        raise ValueError(f"event_type: unknown value(s) {bad}; expected one of {list(EVENT_TYPE_MAP)}")
    return out


def pool_flags(event_types: np.ndarray, played_ratio_pct: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(is_listen_plus, is_like, is_skip) per event; NaN played ratios count as 0 (a skip).

    dislike / unlike / undislike are in no pool (no action bit).
    """
    ratio = np.nan_to_num(np.asarray(played_ratio_pct, dtype=np.float32), nan=0.0)
    is_listen = np.asarray(event_types) == LISTEN_TYPE
    return (is_listen & (ratio >= LISTEN_PLUS_THRESHOLD),
            np.asarray(event_types) == LIKE_TYPE,
            is_listen & (ratio < LISTEN_PLUS_THRESHOLD))


def action_bits(is_lp: np.ndarray, is_like: np.ndarray, is_skip: np.ndarray) -> np.ndarray:
    """int64 action_weight per event: the OR of its pools' bits."""
    return (is_lp.astype(np.int64) * LP_BIT) | (is_like.astype(np.int64) * LIKE_BIT) \
        | (is_skip.astype(np.int64) * SKIP_BIT)


@dataclass(frozen=True)
class TemporalSplit:
    """The Global Temporal Split: train [train_start, train_end), a gap, test [test_start, test_end)."""

    train_start: int
    train_end: int
    test_start: int
    test_end: int

    @classmethod
    def from_last_timestamp(cls, t_max: int, train_days: int = 300, gap_minutes: int = 30,
                            test_days: int = 1) -> "TemporalSplit":
        """The reference's boundaries, counted back from the last event (its defaults: 300 / 30 min / 1)."""
        test_end = int(t_max)
        test_start = test_end - test_days * SECONDS_PER_DAY
        train_end = test_start - gap_minutes * 60
        return cls(train_end - train_days * SECONDS_PER_DAY, train_end, test_start, test_end)

    def is_train(self, timestamps: np.ndarray) -> np.ndarray:
        return (timestamps >= self.train_start) & (timestamps < self.train_end)

    def is_test(self, timestamps: np.ndarray) -> np.ndarray:
        """Test window; like the reference, an event at exactly t_max falls outside it."""
        return (timestamps >= self.test_start) & (timestamps < self.test_end)


def session_ids(uids: np.ndarray, timestamps: np.ndarray, gap_seconds: int = 1800) -> np.ndarray:
    """uint32 session number per event, counted from 0 per user: a new session starts after a
    silence of more than `gap_seconds`. Events must be sorted by (uid, timestamp)."""
    uids, ts = np.asarray(uids), np.asarray(timestamps, dtype=np.int64)
    if len(ts) == 0:
        return np.zeros(0, dtype=np.uint32)
    new_user = np.ones(len(ts), dtype=bool)
    new_user[1:] = uids[1:] != uids[:-1]
    breaks = np.zeros(len(ts), dtype=np.int64)
    breaks[1:] = (np.diff(ts) > gap_seconds) & ~new_user[1:]
    running = np.cumsum(breaks)
    user_first = np.flatnonzero(new_user)
    per_event_base = np.repeat(running[user_first], np.diff(np.append(user_first, len(ts))))
    return (running - per_event_base).astype(np.uint32)
