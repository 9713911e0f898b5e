"""DLRMv4 data-path throughput: Yambda preprocessing, the anchor index, and batches per process.

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_yambda_data.py [--users 2000] [--events-per-user 10000]

Writes a generated multi_event.parquet in Yambda's layout (users' events interleaved in
time order over 302 days, 97 % listens, Yambda's column types) to a temporary folder,
prepares it (dlrmtrain.data.yambda.preprocess), builds the anchor index at the
reference's settings (min_history 4086) and times batches of 1024 samples at the
reference's shape (interleaved history 4086, scan window 20000), then the synthetic
source's batches at the reference shape and at configs/data/synthetic_yambda_mini.yaml's.
Every figure is one process; needs pyarrow (the `yambda` extra).
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrmtrain.data.yambda.batch import to_sequence_batch  # noqa: E402
from dlrmtrain.data.yambda.history import HistoryRule  # noqa: E402
from dlrmtrain.data.yambda.parquet import require_pyarrow, write_parquet  # noqa: E402
from dlrmtrain.data.yambda.preprocess import preprocess_yambda  # noqa: E402
from dlrmtrain.data.yambda.samples import SampleRule, YambdaSamples  # noqa: E402
from dlrmtrain.data.yambda.synthetic import YambdaLikeGenerator, YambdaLikeProfile  # noqa: E402
from dlrmtrain.sequence_features import CROSS_SPECS  # noqa: E402

NUM_ITEMS = 100_000


def write_events(folder: Path, users: int, per_user: int) -> int:
    import pyarrow as pa
    rng = np.random.default_rng(0)
    n = users * per_user
    ts = (rng.random(n) * 302 * 86_400).astype(np.uint32)
    order = np.argsort(ts, kind="stable")               # a log in time order: users interleaved
    kinds = rng.choice(np.array(["listen", "like", "dislike"]), n, p=[0.97, 0.02, 0.01])[order]
    write_parquet(folder / "multi_event.parquet", {
        "uid": np.repeat(np.arange(users, dtype=np.uint32), per_user)[order], "timestamp": ts[order],
        "item_id": rng.integers(0, NUM_ITEMS, n).astype(np.uint32)[order],
        "is_organic": rng.integers(0, 2, n).astype(np.uint8)[order],
        "event_type": pa.array(kinds).dictionary_encode(),
        "played_ratio_pct": np.where(kinds == "listen", rng.integers(0, 101, n), 0).astype(np.uint16),
        "track_length_seconds": np.full(n, 180, np.uint32)})
    items = np.arange(NUM_ITEMS)
    write_parquet(folder / "artist_item_mapping.parquet", {"item_id": items, "artist_id": items // 7})
    write_parquet(folder / "album_item_mapping.parquet", {"item_id": items, "album_id": items // 3})
    return n


def time_batches(make, count: int) -> float:
    make(0)                                            # warm-up: page cache, caches
    t = time.perf_counter()
    for b in range(1, count + 1):
        make(b)
    return (time.perf_counter() - t) / count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=2000)
    p.add_argument("--events-per-user", type=int, default=10_000)
    p.add_argument("--batches", type=int, default=4)
    a = p.parse_args()
    require_pyarrow()
    tmp = Path(tempfile.mkdtemp(prefix="bench_yambda_"))
    try:
        n = write_events(tmp, a.users, a.events_per_user)
        raw = (tmp / "multi_event.parquet").stat().st_size
        t = time.perf_counter()
        meta = preprocess_yambda(tmp / "multi_event.parquet", tmp / "artist_item_mapping.parquet",
                                 tmp / "album_item_mapping.parquet", tmp / "prep", bucket_events=n // 4 + 1)
        dt = time.perf_counter() - t
        store = sum(f.stat().st_size for f in (tmp / "prep").rglob("*") if f.is_file())
        print(f"raw events {n:,} ({raw / n:.1f} B/event in parquet); preprocess {dt:.1f} s = "
              f"{n / dt / 1e6:.2f} M raw events/s; store {store / meta['num_events']:.1f} B/train event; "
              f"peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")
        rule = SampleRule(HistoryRule(4086, 20_000, "interleaved"), min_history=4086, max_seq_len=4096)
        t = time.perf_counter()
        samples = YambdaSamples(tmp / "prep", rule, CROSS_SPECS)
        dt = time.perf_counter() - t
        print(f"anchor index: {len(samples):,} anchors of {meta['num_events']:,} events in {dt:.2f} s "
              f"({meta['num_events'] / dt / 1e6:.1f} M events/s), {samples.num_windows} windows")
        window = max(range(samples.num_windows), key=lambda w: len(samples.window_indices(w)))
        idx = samples.window_indices(window)
        usable = len(idx) // 1024 - 1
        if usable < 1:
            print("too few anchors per window for a 1024 batch: raise --events-per-user")
        else:
            count = min(a.batches, usable)
            per = time_batches(lambda b: to_sequence_batch(samples.columns(idx[b * 1024:(b + 1) * 1024])), count)
            lengths = samples.columns(idx[:1024]).history_lengths.mean()
            print(f"prepared Yambda, 1024-sample batch (history {lengths:.0f} events/sample): {per:.3f} s")
        for name, profile, batch in (("reference shape", YambdaLikeProfile(), 1024),
                                     ("mini shape", YambdaLikeProfile(num_artists=2000, history_length=128,
                                                                      min_history_fraction=0.5), 128)):
            gen = YambdaLikeGenerator(profile, CROSS_SPECS)
            per = time_batches(lambda b: to_sequence_batch(gen.columns(np.arange(b * batch, (b + 1) * batch))),
                               a.batches)
            print(f"synthetic_yambda {name}, {batch}-sample batch: {per:.3f} s")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
