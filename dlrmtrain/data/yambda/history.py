"""Which events a sample sees: the LISTEN anchors and the three-pool history before each.

Mirrors mlcommons/training recommendation_v4 (PR #889), `dlrm_v4/datasets/yambda.py`:
an anchor is a LISTEN event with at least `min_history` earlier events of its user
(events of any type count); its history is read causally from the `scan_window`
events before it (never before the user's first event) and built by one of two
strategies:

- `interleaved` (the reference default): the last `history_length // 3` events of
  each pool (listen_plus, like, skip) independently, merged back in time order;
- `last_n`: the last `history_length` events in any pool.

Events in no pool (dislike / unlike / undislike) never enter a history. The model's
sequence budget then keeps the newest `max_seq_len - candidates - contextual` events.
Pure numpy over the flat, user-major event arrays (events sorted by uid, timestamp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from dlrmtrain.data.yambda.events import LISTEN_TYPE

HistoryStrategy = Literal["interleaved", "last_n"]


def user_runs(flat_uid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first event, one past the last event) of each user's run in user-major order."""
    flat_uid = np.asarray(flat_uid)
    if len(flat_uid) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    changes = np.flatnonzero(flat_uid[1:] != flat_uid[:-1]) + 1
    starts = np.concatenate([[0], changes]).astype(np.int64)
    return starts, np.append(starts[1:], len(flat_uid)).astype(np.int64)


def is_anchor(offset_in_user: np.ndarray, event_types: np.ndarray, min_history: int) -> np.ndarray:
    """The anchor rule per event: a LISTEN with >= min_history earlier events (any type) of its user."""
    return (offset_in_user >= min_history) & (np.asarray(event_types) == LISTEN_TYPE)


def anchor_positions(flat_uid: np.ndarray, event_types: np.ndarray, min_history: int) -> np.ndarray:
    """Flat positions of the anchors in user-major events."""
    starts, ends = user_runs(flat_uid)
    offset_in_user = np.arange(len(flat_uid), dtype=np.int64) - np.repeat(starts, ends - starts)
    return np.flatnonzero(is_anchor(offset_in_user, event_types, min_history)).astype(np.int64)


@dataclass(frozen=True)
class HistoryRule:
    """How an anchor's history is chosen (the reference's dataset arguments)."""

    history_length: int = 4086
    """interleaved: 3 x the per-pool cap (cap = history_length // 3); last_n: the total cap."""
    scan_window: int = 20_000
    """Events before the anchor that are looked at."""
    strategy: HistoryStrategy = "interleaved"

    def scan_range(self, flat_pos: int, user_start: int) -> tuple[int, int]:
        """[lo, hi): the flat positions the anchor at `flat_pos` may look at (causal, own user only)."""
        return max(int(user_start), int(flat_pos) - self.scan_window), int(flat_pos)

    def select(self, is_lp: np.ndarray, is_like: np.ndarray, is_skip: np.ndarray) -> np.ndarray:
        """Indices into one anchor's scan range (its pool flags) of its history events, oldest first."""
        if self.strategy == "last_n":
            member = np.flatnonzero(is_lp | is_like | is_skip)
            return member[len(member) - min(len(member), self.history_length):].astype(np.int64)
        per_pool = max(1, self.history_length // 3)
        return np.sort(np.concatenate([np.flatnonzero(is_lp)[-per_pool:], np.flatnonzero(is_like)[-per_pool:],
                                       np.flatnonzero(is_skip)[-per_pool:]]), kind="stable").astype(np.int64)


def uih_budget(max_seq_len: int, num_candidates: int, num_contextual: int) -> int:
    """History events that fit the model's sequence beside the candidates and contextual features."""
    return max_seq_len - num_candidates - num_contextual
