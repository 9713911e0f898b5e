"""Yambda parquet → the prepared flat store (store.py), streaming in bounded memory.

The reference's preprocessing (mlcommons/training recommendation_v4, PR #889,
`dlrm_v4/preprocess_public_data.py`): encode event types; split by time (the last
`test_days` are test, a `gap_minutes` gap before them, the `train_days` before that
train; counted back from the last event); keep test events of users with training
events; sort training events by (uid, timestamp) and cut sessions at silences over
`session_gap_seconds`; count item popularity. The reference loads the whole file
(about 150 GB of RAM for 5b); here three streaming passes bound memory by one uid
bucket:

1. scan uid / timestamp: the last timestamp (hence the split) and the largest uid;
2. stream all columns, route training events to uid-range bucket files on disk,
   collect test events, count item popularity;
3. per bucket, in uid order: stable-sort by (uid, timestamp) (ties keep file order:
   deterministic, where the reference's polars sort leaves ties unordered), number
   sessions, append to the flat columns.

    dlrmtrain preprocess-yambda --events flat/5b/multi_event.parquet \
        --artists artist_item_mapping.parquet --albums album_item_mapping.parquet --out data/yambda_5b

(`python -m dlrmtrain.data.yambda.preprocess ...`, the older form, runs the same command.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from numpy.lib.format import open_memmap

from dlrmtrain.data.formats.writes import OutputWriteError, check_free_space, write_failed
from dlrmtrain.run.console import human_bytes
from dlrmtrain.run.errors import EXIT_RUN_FAILED, EXIT_USER_ERROR, SetupError
from dlrmtrain.data.yambda.events import TemporalSplit, session_ids
from dlrmtrain.data.yambda.parquet import (
    ALBUM_MAPPING_COLUMNS,
    ARTIST_MAPPING_COLUMNS,
    EVENT_COLUMNS,
    iter_event_batches,
    open_parquet,
    read_mapping,
)
from dlrmtrain.data.yambda.store import EVENT_DTYPES, FORMAT

RAW_COLUMNS = ("uid", "item_id", "timestamp", "event_type", "played_ratio_pct", "is_organic")
"""Columns carried through the buckets (session_id is computed in pass 3)."""


def _scan_extent(events: Path, batch_rows: int) -> tuple[int, int, int]:
    """(rows, last timestamp, largest uid) of multi_event.parquet."""
    pf = open_parquet(events, ("uid", "timestamp"))
    rows, t_max, uid_max = 0, None, -1
    for rb in pf.iter_batches(batch_size=batch_rows, columns=["uid", "timestamp"]):
        if rb.num_rows == 0:
            continue
        ts = rb.column("timestamp").to_numpy(zero_copy_only=False)
        uid = rb.column("uid").to_numpy(zero_copy_only=False)
        rows += rb.num_rows
        t_max = int(ts.max()) if t_max is None else max(t_max, int(ts.max()))
        uid_max = max(uid_max, int(uid.max()))
    if t_max is None:
        raise ValueError(f"{events}: no events")
    return rows, t_max, uid_max


STORE_EVENT_BYTES = sum(dt.itemsize for dt in EVENT_DTYPES.values())  # 26
SPILL_EVENT_BYTES = sum(EVENT_DTYPES[c].itemsize for c in RAW_COLUMNS)  # 22


def _space_needed(rows: int, uid_max: int, bucket_events: int) -> tuple[int, str]:
    """(bytes, what they are) at the peak, at most: the store (every event, a bound for the
    training events plus the test day's), one bucket's spill next to it (pass 3 removes each
    bucket's spill once it is in the store) and the per-user arrays."""
    store = rows * STORE_EVENT_BYTES
    spill = min(rows, bucket_events) * SPILL_EVENT_BYTES
    users = 2 * 8 * (uid_max + 1)
    detail = (f"store {human_bytes(store)}, one bucket's spill {human_bytes(spill)}, "
              f"user index {human_bytes(users)}")
    return store + spill + users + (1 << 16), detail  # + store.json and the .npy headers


def _replaced_bytes(out: Path) -> int:
    """Bytes of an earlier store in `out` that this preprocess overwrites."""
    old = [*(out / "events").glob("*.npy"), *(out / "_buckets").glob("*.bin")]
    return sum(p.stat().st_size for p in old if p.is_file())


def _catalog(artists: Path, albums: Path) -> tuple[np.ndarray, np.ndarray]:
    """item → artist and item → album arrays over max(item_id) + 1 of both maps (0: unmapped)."""
    a_items, a_vals = read_mapping(artists, "artist_id")
    b_items, b_vals = read_mapping(albums, "album_id")
    n_items = int(max(a_items.max(initial=-1), b_items.max(initial=-1))) + 1
    to_artist, to_album = np.zeros(n_items, np.int64), np.zeros(n_items, np.int64)
    to_artist[a_items], to_album[b_items] = a_vals, b_vals
    return to_artist, to_album


def preprocess_yambda(events: str | Path, artists: str | Path, albums: str | Path, out: str | Path,
                      train_days: int = 300, gap_minutes: int = 30, test_days: int = 1,
                      session_gap_seconds: int = 1800, bucket_events: int = 200_000_000,
                      batch_rows: int = 4_000_000) -> dict:
    """Prepare `out` from the raw files; returns the store.json record. `bucket_events` bounds
    pass 3's memory (about 60 bytes per event of one bucket); disk holds the raw file, the
    bucket spill (22 bytes per event) and the store (26), the spill shrinking as the store
    fills. The space is checked after pass 1 (which only reads), before anything is written;
    the spill is removed on every failure."""
    events, out = Path(events), Path(out)
    rows, t_max, uid_max = _scan_extent(events, batch_rows)
    split = TemporalSplit.from_last_timestamp(t_max, train_days, gap_minutes, test_days)
    if uid_max >= 2**32:
        raise ValueError(f"{events}: uid {uid_max} does not fit the store's uint32")
    num_buckets = max(1, -(-rows // bucket_events))
    uids_per_bucket = -(-(uid_max + 1) // num_buckets)
    needed, detail = _space_needed(rows, uid_max, bucket_events)
    check_free_space(out, needed, detail, "free some space or choose another --out",
                     reclaimed=_replaced_bytes(out))
    spill = out / "_buckets"
    try:
        return _prepare(events, artists, albums, out, rows, t_max, uid_max, split, num_buckets,
                        uids_per_bucket, train_days, gap_minutes, test_days, session_gap_seconds,
                        batch_rows)
    except BaseException:
        shutil.rmtree(spill, ignore_errors=True)  # the spill is temporary: never left to fill a disk
        raise


def _prepare(events: Path, artists, albums, out: Path, rows: int, t_max: int, uid_max: int,
             split: TemporalSplit, num_buckets: int, uids_per_bucket: int, train_days: int,
             gap_minutes: int, test_days: int, session_gap_seconds: int, batch_rows: int) -> dict:
    """Passes 2 and 3, and the store's small files (see the module docstring)."""
    spill = out / "_buckets"
    if spill.exists():
        shutil.rmtree(spill)
    (out / "events").mkdir(parents=True, exist_ok=True)
    spill.mkdir()
    bucket_rows, popularity, test_parts = _spill_by_user_bucket(
        events, spill, rows, split, num_buckets, uids_per_bucket, batch_rows)
    n = int(bucket_rows.sum())
    if n == 0:
        raise ValueError(f"{events}: no events in the training window {split}")
    if int(np.flatnonzero(popularity).max()) >= 2**32:
        raise ValueError(f"{events}: item ids do not fit the store's uint32")
    user_start, user_end = _write_sorted_events(out, spill, bucket_rows, uid_max, session_gap_seconds)
    shutil.rmtree(spill)

    to_artist, to_album = _catalog(Path(artists), Path(albums))
    if len(popularity) != len(to_artist):
        # The reference refuses this too: the item table would silently change size.
        raise ValueError(f"item popularity covers {len(popularity)} items but {artists} / {albums} map "
                         f"{len(to_artist)}: the events and the catalog maps come from different releases")
    np.save(out / "user_start.npy", user_start)
    np.save(out / "user_end.npy", user_end)
    np.save(out / "item_to_artist.npy", to_artist)
    np.save(out / "item_to_album.npy", to_album)
    np.save(out / "item_popularity.npy", popularity)
    num_test_events = _write_test_events(out, test_parts, user_start, uid_max)

    meta = {"format": FORMAT, "source": str(events), "num_raw_events": rows, "num_events": n,
            "num_test_events": num_test_events, "num_users": int((user_start >= 0).sum()),
            "num_items": int(len(to_artist)), "t_max": t_max, "train_start": split.train_start,
            "train_end": split.train_end, "test_start": split.test_start, "test_end": split.test_end,
            "train_days": train_days, "gap_minutes": gap_minutes, "test_days": test_days,
            "session_gap_seconds": session_gap_seconds}
    (out / "store.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _spill_by_user_bucket(events: Path, spill: Path, rows: int, split: TemporalSplit, num_buckets: int,
                          uids_per_bucket: int, batch_rows: int
                          ) -> tuple[np.ndarray, np.ndarray, list[dict[str, np.ndarray]]]:
    """Pass 2: the training events into one spill file per (uid bucket, column); returns the
    rows per bucket, the items' training popularity and the test events' parts."""
    files = {(b, c): open(spill / f"{b}_{c}.bin", "wb") for b in range(num_buckets) for c in RAW_COLUMNS}
    bucket_rows = np.zeros(num_buckets, np.int64)
    popularity = np.zeros(0, np.int64)
    test_parts: list[dict[str, np.ndarray]] = []
    try:
        for cols in iter_event_batches(events, batch_rows):
            train = split.is_train(cols["timestamp"])
            test = split.is_test(cols["timestamp"])
            if test.any():
                test_parts.append({c: cols[c][test] for c in RAW_COLUMNS})
            if not train.any():
                continue
            tr = {c: cols[c][train] for c in RAW_COLUMNS}
            counts = np.bincount(tr["item_id"])
            if len(counts) > len(popularity):
                popularity = np.pad(popularity, (0, len(counts) - len(popularity)))
            popularity[:len(counts)] += counts
            bucket = tr["uid"] // uids_per_bucket
            order = np.argsort(bucket, kind="stable")
            bounds = np.searchsorted(bucket[order], np.arange(num_buckets + 1))
            for b in np.flatnonzero(np.diff(bounds)):
                sel = order[bounds[b]:bounds[b + 1]]
                for c in RAW_COLUMNS:
                    try:
                        tr[c][sel].astype(EVENT_DTYPES[c], copy=False).tofile(files[(b, c)])
                    except OSError as e:
                        raise write_failed(spill / f"{b}_{c}.bin", e, files[(b, c)].tell(),
                                           rows * EVENT_DTYPES[c].itemsize // num_buckets,
                                           removed=f"the spill {spill.name}/") from None
                bucket_rows[b] += len(sel)
    finally:
        for f in files.values():
            f.close()
    return bucket_rows, popularity, test_parts


def _write_sorted_events(out: Path, spill: Path, bucket_rows: np.ndarray, uid_max: int,
                         session_gap_seconds: int) -> tuple[np.ndarray, np.ndarray]:
    """Pass 3: each bucket sorted by (uid, time) into the store's event columns, its spill
    files removed as it goes; returns each user's [start, end) in the store (-1: none)."""
    n = int(bucket_rows.sum())
    cols_out = {c: open_memmap(out / "events" / f"{c}.npy", mode="w+", dtype=dt, shape=(n,))
                for c, dt in EVENT_DTYPES.items()}
    user_start = np.full(uid_max + 1, -1, np.int64)
    user_end = np.full(uid_max + 1, -1, np.int64)
    at = 0
    for b in range(len(bucket_rows)):
        m = int(bucket_rows[b])
        if m == 0:
            continue
        part = {c: np.fromfile(spill / f"{b}_{c}.bin", dtype=EVENT_DTYPES[c]) for c in RAW_COLUMNS}
        order = np.lexsort((part["timestamp"], part["uid"]))                     # stable
        for c in RAW_COLUMNS:
            cols_out[c][at:at + m] = part[c][order]
        uid_sorted = part["uid"][order]
        cols_out["session_id"][at:at + m] = session_ids(uid_sorted, part["timestamp"][order], session_gap_seconds)
        first = np.concatenate([[0], np.flatnonzero(uid_sorted[1:] != uid_sorted[:-1]) + 1])
        users = uid_sorted[first].astype(np.int64)
        user_start[users] = at + first
        user_end[users] = at + np.append(first[1:], m)
        at += m
        del part, order, uid_sorted
        for c in RAW_COLUMNS:  # the spill shrinks as the store grows: disk peak ~ one copy
            (spill / f"{b}_{c}.bin").unlink()
    for arr in cols_out.values():
        arr.flush()
    return user_start, user_end


def _write_test_events(out: Path, test_parts: list[dict[str, np.ndarray]], user_start: np.ndarray,
                       uid_max: int) -> int:
    """The test window's events of users the store knows, sorted by (uid, time); how many."""
    test = {c: np.concatenate([p[c] for p in test_parts]) if test_parts else np.zeros(0, EVENT_DTYPES[c])
            for c in RAW_COLUMNS}
    keep = user_start[np.minimum(test["uid"], uid_max)] >= 0
    test = {c: v[keep] for c, v in test.items()}
    order = np.lexsort((test["timestamp"], test["uid"]))
    np.savez(out / "test_events.npz", **{c: v[order] for c, v in test.items()})
    return int(len(order))


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", required=True, help="flat/<size>/multi_event.parquet")
    p.add_argument("--artists", required=True, help="artist_item_mapping.parquet")
    p.add_argument("--albums", required=True, help="album_item_mapping.parquet")
    p.add_argument("--out", required=True, help="output directory (the prepared dataset)")
    p.add_argument("--train-days", type=int, default=300)
    p.add_argument("--gap-minutes", type=int, default=30)
    p.add_argument("--test-days", type=int, default=1)
    p.add_argument("--session-gap-seconds", type=int, default=1800)
    p.add_argument("--bucket-events", type=int, default=200_000_000,
                   help="events sorted at once in pass 3 (about 60 bytes each of RAM)")
    a = p.parse_args(argv)
    try:
        # A mistyped catalog path fails now, not after the hours of passes 1-3 on 5b.
        for path, columns in ((a.events, EVENT_COLUMNS), (a.artists, ARTIST_MAPPING_COLUMNS),
                              (a.albums, ALBUM_MAPPING_COLUMNS)):
            open_parquet(Path(path), columns)
        meta = preprocess_yambda(a.events, a.artists, a.albums, a.out, a.train_days, a.gap_minutes,
                                 a.test_days, a.session_gap_seconds, a.bucket_events)
    except OutputWriteError as e:  # under way (a full disk): names the file and its sizes
        print(f"error: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except (ValueError, OSError, ImportError, SetupError) as e:  # bad or missing input (the
        print(f"error: {e}", file=sys.stderr)  # message names the file), no pyarrow, or too
        return EXIT_USER_ERROR                 # little space (refused before writing)
    print(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    print("note: this is `dlrmtrain preprocess-yambda` now; the same command runs here",
          file=sys.stderr)
    sys.exit(main(prog="python -m dlrmtrain.data.yambda.preprocess"))
