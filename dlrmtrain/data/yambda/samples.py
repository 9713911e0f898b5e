"""Samples of a prepared Yambda dataset: anchors, their daily windows and their features.

Mirrors mlcommons/training recommendation_v4 (PR #889), `dlrm_v4/datasets/yambda.py`
(`DLRMv4YambdaDataset`): the anchors are LISTEN events with enough earlier events
(history.py); the streaming order cuts them into windows of `window_seconds` by the
anchor's timestamp (window 0 starts at the first anchor), in user-major order inside a
window, optionally partly shuffled (`shuffle_fraction`, the reference's
STREAMING_SHUFFLE_FRACTION) and with a user holdout (`train_fraction` < 1: users whose
uid hash is at or above it are never trained). A sample's features: the history's
item / artist / album / pool bits / timestamps, the candidate (the anchor's item, its
artist and album, the last history timestamp as query time, the listen_plus bit as its
action weight) and the 7 crosses hashed from the anchor (cross_hash.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from dlrmtrain.data.yambda.anchor_index import load_anchor_index
from dlrmtrain.data.yambda.batch import SampleColumns
from dlrmtrain.data.yambda.cross_hash import cross_ids, hour_of_day, unit_hash
from dlrmtrain.data.yambda.events import LISTEN_PLUS_THRESHOLD, LISTEN_TYPE, LP_BIT, action_bits, pool_flags
from dlrmtrain.data.yambda.history import HistoryRule, uih_budget
from dlrmtrain.data.yambda.store import EventStore
from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES

CrossSpec = tuple[str, Sequence[str], int, int]
"""(name, keys, table rows, salt), as sequence_features.CROSS_SPECS."""
HISTORY_KEYS = ("item_id", "action_weight", "action_timestamp")


@dataclass(frozen=True)
class SampleRule:
    """What a sample holds (the reference's dataset and model settings)."""

    history: HistoryRule = HistoryRule()
    min_history: int = 4086
    """Earlier events (any type) a LISTEN needs to be an anchor."""
    max_seq_len: int = 4096
    """Model sequence budget: history is cut to max_seq_len - 1 candidate - 8 contextual."""
    window_seconds: int = 86_400
    shuffle_fraction: float = 0.0
    shuffle_seed: int = 0
    train_fraction: float = 1.0
    """Share of users trained; the rest (by uid hash) are only evaluated. 1.0: no holdout."""
    split_salt: int = 0


class YambdaSamples:
    """Anchor-indexed samples of a prepared dataset. Index i means the i-th anchor in user-major order."""

    def __init__(self, store: EventStore | str | Path, rule: SampleRule, crosses: Sequence[CrossSpec]) -> None:
        self.store = store if isinstance(store, EventStore) else EventStore(store)
        self.rule, self.crosses = rule, [(n, tuple(k), int(r), int(s)) for n, k, r, s in crosses]
        self.index = load_anchor_index(self.store, rule.min_history, rule.window_seconds)
        self.anchors, self.t_min, self.num_windows = self.index.anchors, self.index.t_min, self.index.num_windows

    def __len__(self) -> int:
        return len(self.anchors)

    # ---- which anchors, in which order ----
    def window_indices(self, ts: int) -> np.ndarray:
        """Anchor indices in window `ts` ([t_min + ts*W, t_min + (ts+1)*W)), user-major."""
        return self.index.window(ts)

    def _held_out(self, idx: np.ndarray) -> np.ndarray:
        uids = np.asarray(self.store.events["uid"][self.anchors[idx]])
        return unit_hash(uids, self.rule.split_salt) >= self.rule.train_fraction

    def _shuffle(self, idx: np.ndarray, ts: int) -> np.ndarray:
        """The reference's in-window shuffle: a pure function of (seed, ts)."""
        frac = self.rule.shuffle_fraction
        if idx.size <= 1 or frac <= 0.0:
            return idx
        rng = np.random.default_rng(self.rule.shuffle_seed + ts)
        if frac >= 1.0:
            return idx[rng.permutation(idx.size)]
        k = max(1, int(round(frac * idx.size)))
        seg = np.arange(idx.size, dtype=np.int64) // k
        return idx[np.lexsort((rng.random(idx.size), seg))]

    def train_indices(self, ts: int) -> np.ndarray:
        idx = self.window_indices(ts)
        if self.rule.train_fraction < 1.0:
            idx = idx[~self._held_out(idx)]
        return self._shuffle(idx, ts)

    def train_window_sizes(self, windows: range) -> list[int]:
        """Samples of train_indices(ts) per window, without holding them (one window at a time)."""
        if self.rule.train_fraction >= 1.0:
            return [len(self.index.order[self.index.offsets[ts]:self.index.offsets[ts + 1]])
                    if 0 <= ts < self.num_windows else 0 for ts in windows]
        return [int((~self._held_out(self.window_indices(ts))).sum()) for ts in windows]

    def eval_indices(self, start_ts: int, num_windows: int = 1) -> np.ndarray:
        """The fixed eval set: the held-out users' anchors (all anchors without a holdout)."""
        parts = [self.window_indices(ts) for ts in range(start_ts, start_ts + max(1, num_windows))]
        idx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return idx[self._held_out(idx)] if self.rule.train_fraction < 1.0 else idx

    # ---- features ----
    def _histories(self, pos: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(history lengths, item_id / action_weight / action_timestamp of the history events, sample after
        sample) of anchors `pos`. Scan ranges that overlap (a user's anchors: user-major order) form one
        segment, read from the store and classified into pools once."""
        ev, rule = self.store.events, self.rule.history
        budget = uih_budget(self.rule.max_seq_len, 1, len(CONTEXTUAL_FEATURES))
        lo = np.maximum(self.store.user_start[np.asarray(ev["uid"][pos], dtype=np.int64)], pos - rule.scan_window)
        by_lo = np.argsort(lo, kind="stable")
        reach = np.maximum.accumulate(pos[by_lo])                  # a range ends at its anchor
        segment = np.concatenate([[0], np.cumsum(lo[by_lo][1:] > reach[:-1])]) if len(pos) else by_lo
        empty = np.zeros(0, np.int64)
        per_sample: list[dict[str, np.ndarray]] = [dict.fromkeys(HISTORY_KEYS, empty)] * len(pos)
        for members in np.split(by_lo, np.flatnonzero(np.diff(segment)) + 1) if len(pos) else []:
            s_lo, s_hi = int(lo[members].min()), int(pos[members].max())
            if s_hi <= s_lo:
                continue
            flags = pool_flags(np.asarray(ev["event_type"][s_lo:s_hi]), np.asarray(ev["played_ratio_pct"][s_lo:s_hi]))
            cols = {"item_id": np.asarray(ev["item_id"][s_lo:s_hi], dtype=np.int64),
                    "action_weight": action_bits(*flags),
                    "action_timestamp": np.asarray(ev["timestamp"][s_lo:s_hi], dtype=np.int64)}
            for i in members:
                a, b = int(lo[i]) - s_lo, int(pos[i]) - s_lo
                if b > a:
                    keep = rule.select(flags[0][a:b], flags[1][a:b], flags[2][a:b])[-budget:] + a
                    per_sample[i] = {k: v[keep] for k, v in cols.items()}
        lengths = np.array([len(h["item_id"]) for h in per_sample], dtype=np.int64)
        return lengths, {k: np.concatenate([h[k] for h in per_sample]) if len(pos) else empty
                         for k in HISTORY_KEYS}

    # ---- features ----
    def columns(self, indices: np.ndarray) -> SampleColumns:
        """The features of anchors `indices`, as the reference's `_build_sample` builds them."""
        st, ev = self.store, self.store.events
        pos = np.asarray(self.anchors[np.asarray(indices, dtype=np.int64)], dtype=np.int64)
        lengths, hist = self._histories(pos)
        items, h_ts = hist["item_id"], hist["action_timestamp"]
        uid = np.asarray(ev["uid"][pos], dtype=np.int64)
        target = np.asarray(ev["item_id"][pos], dtype=np.int64)
        target_ts = np.asarray(ev["timestamp"][pos], dtype=np.int64)
        is_lp = (np.asarray(ev["event_type"][pos]) == LISTEN_TYPE) & \
            (np.asarray(ev["played_ratio_pct"][pos]) >= LISTEN_PLUS_THRESHOLD)
        last = np.cumsum(lengths) - 1
        query_time = np.where(lengths > 0, h_ts[np.maximum(last, 0)] if len(h_ts) else 0, target_ts)
        anchor = {"uid": uid, "item_id": target, "artist_id": st.candidate_artist(target),
                  "album_id": st.candidate_album(target), "hour_of_day": hour_of_day(target_ts),
                  "is_organic": np.asarray(ev["is_organic"][pos], dtype=np.int64)}
        return SampleColumns(
            uid=uid,
            crosses={name: cross_ids(anchor, keys, rows, salt) for name, keys, rows, salt in self.crosses},
            history_lengths=lengths,
            history={"item_id": items, "artist_id": st.artists_of(items), "album_id": st.albums_of(items),
                     "action_weight": hist["action_weight"], "action_timestamp": h_ts},
            candidate={"item_candidate_id": target, "item_candidate_artist_id": anchor["artist_id"],
                       "item_candidate_album_id": anchor["album_id"], "item_query_time": query_time,
                       "item_action_weight": np.where(is_lp, LP_BIT, 0).astype(np.int64)})
