"""The anchors of a prepared dataset and their streaming windows, built once and memory-mapped.

Anchors (history.py) are found in chunks of events; their window (anchor timestamp -
first anchor timestamp) // window_seconds orders them by a chunked counting sort that
keeps user-major order inside a window. Both arrays are cached beside the store
(anchors_min<M>.npy, windows_min<M>_w<W>.npy / .json) under a file lock, so the first
rank builds them and every rank then maps the same pages (the reference does the same
with its positions / anchor_ts caches). On 5b they hold ~2.3 G anchors: ~18 GB each,
on disk, not in any rank's memory. A read-only store directory gets them in memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from dlrmtrain.data.yambda.history import is_anchor
from dlrmtrain.data.yambda.store import EventStore

CHUNK = 1 << 26
"""Elements per pass: bounds the temporaries (a few 100 MB) on 5b."""


def find_anchors(store: EventStore, min_history: int) -> np.ndarray:
    """Flat positions of the anchors (history.is_anchor), a chunk of events at a time."""
    uid, types = store.events["uid"], store.events["event_type"]
    out = []
    for lo in range(0, store.num_events, CHUNK):
        hi = min(store.num_events, lo + CHUNK)
        offset = np.arange(lo, hi, dtype=np.int64) - store.user_start[np.asarray(uid[lo:hi], dtype=np.int64)]
        out.append(np.flatnonzero(is_anchor(offset, types[lo:hi], min_history)) + lo)
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)


def _chunks(n: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, CHUNK):
        yield lo, min(n, lo + CHUNK)


def window_order(anchor_ts: Callable[[int, int], np.ndarray], n: int, window_seconds: int
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """(anchor indices sorted by window, stable; window offsets; first anchor timestamp)."""
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64), 0
    t_min = min(int(anchor_ts(lo, hi).min()) for lo, hi in _chunks(n))
    t_max = max(int(anchor_ts(lo, hi).max()) for lo, hi in _chunks(n))
    num_windows = (t_max - t_min) // window_seconds + 1
    counts = np.zeros(num_windows, np.int64)
    for lo, hi in _chunks(n):
        counts += np.bincount((anchor_ts(lo, hi) - t_min) // window_seconds, minlength=num_windows)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    order, filled = np.empty(n, np.int64), offsets[:-1].copy()
    for lo, hi in _chunks(n):
        w = (anchor_ts(lo, hi) - t_min) // window_seconds
        idx = np.argsort(w, kind="stable")
        ws = w[idx]
        first_of_group = np.searchsorted(ws, ws, side="left")        # rank inside its window group
        order[filled[ws] + np.arange(len(ws)) - first_of_group] = idx + lo
        filled += np.bincount(w, minlength=num_windows)
    return order, offsets, t_min


@dataclass
class AnchorIndex:
    anchors: np.ndarray
    """Flat positions of the anchors, user-major (anchor index i → anchors[i])."""
    order: np.ndarray
    """Anchor indices by window, user-major inside a window."""
    offsets: np.ndarray
    """Window w is order[offsets[w]:offsets[w + 1]]."""
    t_min: int
    """Timestamp of the first anchor: window 0 starts there."""
    window_seconds: int

    @property
    def num_windows(self) -> int:
        return len(self.offsets) - 1

    def window(self, ts: int) -> np.ndarray:
        if not 0 <= ts < self.num_windows:
            return np.zeros(0, np.int64)
        return np.asarray(self.order[self.offsets[ts]:self.offsets[ts + 1]], dtype=np.int64)


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[bool]:
    """Exclusive lock in `directory`; yields False (no caching) when it is not writable."""
    try:
        f = open(directory / "_anchor_index.lock", "w")
    except OSError:
        yield False
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.npy")
    np.save(tmp, array)
    tmp.replace(path)


def load_anchor_index(store: EventStore, min_history: int, window_seconds: int) -> AnchorIndex:
    d = store.dir
    anchors_path = d / f"anchors_min{min_history}.npy"
    order_path = d / f"windows_min{min_history}_w{window_seconds}.npy"
    meta_path = order_path.with_suffix(".json")
    with _build_lock(d) as cache:
        if cache and anchors_path.is_file():
            anchors = np.load(anchors_path, mmap_mode="r")
        else:
            anchors = find_anchors(store, min_history)
            if cache:
                _save(anchors_path, anchors)
        if cache and order_path.is_file() and meta_path.is_file():
            meta = json.loads(meta_path.read_text())
            return AnchorIndex(anchors, np.load(order_path, mmap_mode="r"), np.asarray(meta["offsets"], np.int64),
                               int(meta["t_min"]), window_seconds)
        ts = store.events["timestamp"]
        order, offsets, t_min = window_order(lambda lo, hi: np.asarray(ts[anchors[lo:hi]], np.int64),
                                             len(anchors), window_seconds)
        if cache:
            _save(order_path, order)
            meta_path.write_text(json.dumps({"t_min": t_min, "offsets": offsets.tolist()}))
        return AnchorIndex(anchors, order, offsets, t_min, window_seconds)
