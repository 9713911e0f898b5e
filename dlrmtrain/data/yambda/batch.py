"""Per-sample columns → one `SequenceBatch` (the reference's collated `Samples`).

Both Yambda sources (the parquet reader and the synthetic generator) fill a
`SampleColumns` for a batch; this module lays it out as the reference's KJTs:
key-major values, contextual features one value per sample, sequence features one
value per history event, candidates one value per sample, `dummy_watch_time` zeros
and `item_dummy_watchtime` ones. (The reference also appends an unused
`dummy_query_time` key to its UIH KJT; no model code reads it, so it is left out.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.sequence_features import (CANDIDATE_FEATURES, CONTEXTUAL_FEATURES, CROSS_NAMES, SequenceBatch,
                                         UIH_FEATURES)

HISTORY_COLUMNS = ("item_id", "artist_id", "album_id", "action_weight", "action_timestamp")


@dataclass
class SampleColumns:
    """One batch as numpy columns (B samples)."""

    uid: np.ndarray
    """[B] user ids."""
    crosses: dict[str, np.ndarray]
    """Cross name → [B] hashed row ids (every name of CROSS_NAMES)."""
    history_lengths: np.ndarray
    """[B] history events per sample."""
    history: dict[str, np.ndarray]
    """HISTORY_COLUMNS → [sum(history_lengths)] values, sample after sample, oldest event first."""
    candidate: dict[str, np.ndarray]
    """item_candidate_id, item_candidate_artist_id, item_candidate_album_id, item_query_time,
    item_action_weight → [B]."""

    def take(self, rows: np.ndarray) -> "SampleColumns":
        """The samples `rows` (in that order; repeats allowed, e.g. for eval padding)."""
        rows = np.asarray(rows, dtype=np.int64)
        ends = np.cumsum(self.history_lengths)
        starts = ends - self.history_lengths
        lengths = self.history_lengths[rows]
        flat = np.concatenate([np.arange(starts[r], ends[r]) for r in rows]) if len(rows) else \
            np.zeros(0, np.int64)
        return SampleColumns(self.uid[rows], {k: v[rows] for k, v in self.crosses.items()}, lengths,
                             {k: v[flat] for k, v in self.history.items()},
                             {k: v[rows] for k, v in self.candidate.items()})


def to_sequence_batch(cols: SampleColumns) -> SequenceBatch:
    """The KJTs of UIH_FEATURES and CANDIDATE_FEATURES, in those key orders.

    The values are laid out once, as `sparse` has them (uih's keys, then the candidates'):
    `uih` and `candidates` are its two halves (views, no copy of ~0.13 GB a batch at the
    reference shape)."""
    b = len(cols.uid)
    hist_len = np.asarray(cols.history_lengths, dtype=np.int64)
    n_events = int(hist_len.sum())
    uih_values = {"uid": cols.uid, **{name: cols.crosses[name] for name in CROSS_NAMES},
                  **cols.history, "dummy_watch_time": np.zeros(n_events, np.int64)}
    ones = np.ones(b, dtype=np.int64)
    cand_values = {**cols.candidate, "item_dummy_watchtime": ones}
    parts = [np.asarray(uih_values[k]) for k in UIH_FEATURES] + [np.asarray(cand_values[k]) for k in CANDIDATE_FEATURES]
    values = torch.from_numpy(np.concatenate(parts, dtype=np.int64, casting="unsafe"))
    n_uih = sum(len(v) for v in parts[:len(UIH_FEATURES)])
    uih_lengths = np.concatenate([ones if k in CONTEXTUAL_FEATURES else hist_len for k in UIH_FEATURES])
    lengths = torch.from_numpy(np.concatenate([uih_lengths, np.ones(b * len(CANDIDATE_FEATURES), np.int64)]))
    uih = KeyedJaggedTensor(keys=list(UIH_FEATURES), values=values[:n_uih], lengths=lengths[:len(uih_lengths)])
    candidates = KeyedJaggedTensor(keys=list(CANDIDATE_FEATURES), values=values[n_uih:],
                                   lengths=lengths[len(uih_lengths):])
    sparse = KeyedJaggedTensor.from_lengths_sync(keys=uih.keys() + candidates.keys(), values=values, lengths=lengths)
    return SequenceBatch(uih, candidates, sparse)
