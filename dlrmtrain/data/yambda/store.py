"""The prepared Yambda dataset on disk: the training events flat and user-major, memory-mapped.

Written by preprocess.py, read by samples.py. The reference (mlcommons/training
recommendation_v4, PR #889) keeps the same content as `train_sessions.parquet` plus a
flat int64 `.npy` cache; here the flat columns are the dataset itself, in compact
dtypes (26 bytes per event instead of ~48):

    <dir>/store.json              format, split boundaries, counts, the preprocessing settings
    <dir>/events/<column>.npy     one value per training event, sorted by (uid, timestamp)
    <dir>/user_start.npy, user_end.npy   per uid: its first / one-past-last event (-1: none)
    <dir>/item_to_artist.npy, item_to_album.npy   the catalog maps (0 for unmapped items)
    <dir>/item_popularity.npy     training events per item
    <dir>/test_events.npz         the test day's events of users with training events (unused
                                  by training, as in the reference)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

FORMAT = "dlrmtrain-yambda-1"
EVENT_DTYPES: dict[str, np.dtype] = {
    "uid": np.dtype(np.uint32), "item_id": np.dtype(np.uint32), "timestamp": np.dtype(np.int64),
    "event_type": np.dtype(np.uint8), "played_ratio_pct": np.dtype(np.float32),
    "is_organic": np.dtype(np.uint8), "session_id": np.dtype(np.uint32),
}
"""Columns of events/ and their dtypes."""


class EventStore:
    """A prepared dataset, opened read-only (every column memory-mapped)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        meta_path = self.dir / "store.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path}: not a prepared Yambda dataset "
                                    "(run `dlrmtrain preprocess-yambda` first)")
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path}: format {self.meta.get('format')!r}, expected {FORMAT!r}")
        self.events = {name: self._load(f"events/{name}.npy", dtype) for name, dtype in EVENT_DTYPES.items()}
        self.num_events = len(self.events["uid"])
        self.user_start = self._load("user_start.npy", np.dtype(np.int64))
        self.user_end = self._load("user_end.npy", np.dtype(np.int64))
        self.item_to_artist = self._load("item_to_artist.npy", np.dtype(np.int64))
        self.item_to_album = self._load("item_to_album.npy", np.dtype(np.int64))
        if self.meta["num_events"] != self.num_events:
            raise ValueError(f"{meta_path}: records {self.meta['num_events']} events, "
                             f"events/uid.npy holds {self.num_events}")

    def _load(self, name: str, dtype: np.dtype) -> np.ndarray:
        path = self.dir / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing from the prepared dataset")
        arr = np.load(path, mmap_mode="r")
        if arr.dtype != dtype:
            raise ValueError(f"{path}: dtype {arr.dtype}, expected {dtype}")
        return arr

    @property
    def num_items(self) -> int:
        return len(self.item_to_artist)

    def artists_of(self, items: np.ndarray) -> np.ndarray:
        """History items' artists as the reference maps them (ids past the map clip to its last row)."""
        return np.asarray(self.item_to_artist[np.minimum(items, self.num_items - 1)], dtype=np.int64)

    def albums_of(self, items: np.ndarray) -> np.ndarray:
        return np.asarray(self.item_to_album[np.minimum(items, self.num_items - 1)], dtype=np.int64)

    def candidate_artist(self, items: np.ndarray) -> np.ndarray:
        """Candidates' artists as the reference maps them (0 for ids past the map)."""
        items = np.asarray(items, dtype=np.int64)
        return np.where(items < self.num_items, self.artists_of(items), 0)

    def candidate_album(self, items: np.ndarray) -> np.ndarray:
        items = np.asarray(items, dtype=np.int64)
        return np.where(items < self.num_items, self.albums_of(items), 0)
