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

from dlrmtrain.recycled import RecycledArrays
from dlrmtrain.sequence_features import CANDIDATE_FEATURES, HISTORY_FEATURES, UIH_FEATURES, SequenceBatch

HISTORY_COLUMNS = ("item_id", "artist_id", "album_id", "action_weight", "action_timestamp")
RECYCLED_VALUES = RecycledArrays(keep=4)
"""The buffers of batches' values, used again once a batch is gone (~0.15 GB each at the
reference shape: 4 kept free at most, about what a loader's workers and prefetch hold)."""


class BatchValues:
    """A batch's KJT values in one int64 array, laid out as `SequenceBatch.sparse` has them
    (UIH_FEATURES then CANDIDATE_FEATURES, key-major), with a view per key (`of`). A source
    may write its history columns straight into `of[column]` and hand those views on in its
    `SampleColumns`: `to_sequence_batch` then leaves them in place (at the reference shape one
    copy of ~0.1 GB of new memory a batch fewer). The array comes from RECYCLED_VALUES: memory
    an earlier, finished batch used, where there is one (dlrmtrain/recycled.py)."""

    def __init__(self, batch_size: int, history_events: int) -> None:
        self.batch_size, self.history_events = batch_size, history_events
        keys = [*UIH_FEATURES, *CANDIDATE_FEATURES]
        sizes = [history_events if k in HISTORY_FEATURES else batch_size for k in keys]
        self.array = RECYCLED_VALUES.empty(sum(sizes))
        ends = np.cumsum(sizes).tolist()
        self.of = {k: self.array[e - n:e] for k, n, e in zip(keys, sizes, ends)}


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
    values: BatchValues | None = None
    """Where the source wrote the history columns in place (they are its views), else None."""

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
    """The KJTs of UIH_FEATURES and CANDIDATE_FEATURES, in those key orders: `sparse` over
    one `BatchValues`, `uih` and `candidates` its two halves (views, no copy)."""
    b = len(cols.uid)
    hist_len = np.asarray(cols.history_lengths, dtype=np.int64)
    n_events = int(hist_len.sum())
    made = cols.values
    if made is None or (made.batch_size, made.history_events) != (b, n_events):
        made = BatchValues(b, n_events)
    sources = {"uid": cols.uid, **cols.crosses, **cols.history, **cols.candidate}
    for key, view in made.of.items():
        if key in ("dummy_watch_time", "item_dummy_watchtime"):
            view.fill(0 if key == "dummy_watch_time" else 1)
        elif sources[key] is not view:  # a history column the source wrote in place stays
            np.copyto(view, sources[key], casting="unsafe")
    values = torch.from_numpy(made.array)
    n_uih = sum(len(made.of[k]) for k in UIH_FEATURES)
    uih_lengths = np.concatenate([hist_len if k in HISTORY_FEATURES else np.ones(b, np.int64) for k in UIH_FEATURES])
    lengths = torch.from_numpy(np.concatenate([uih_lengths, np.ones(b * len(CANDIDATE_FEATURES), np.int64)]))
    return SequenceBatch.joined(values, lengths, n_uih, len(uih_lengths))
