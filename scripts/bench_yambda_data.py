"""DLRMv4 data-path throughput: Yambda preprocessing, the anchor index, and batches per process.

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_yambda_data.py [--users 2000] [--events-per-user 10000]
        [--sections prepared,synthetic,transform,workers] [--rounds 3] [--worker-batches 8] [--cpu-time]

Writes a generated multi_event.parquet in Yambda's layout (users' events interleaved in
time order over 302 days, 97 % listens, Yambda's column types) to a temporary folder,
prepares it (dlrmtrain.data.yambda.preprocess), builds the anchor index at the
reference's settings (min_history 4086) and times batches of 1024 samples at the
reference's shape (interleaved history 4086, scan window 20000), then the synthetic
source's batches at the reference shape and at configs/data/synthetic_yambda_mini.yaml's
(`prepared`, `synthetic`). `transform`: the source transform of `comm.dedup_at: source` on
reference-shape batches, its distinct ids by a full sort per table (torch.unique) and by
comm/dedup/unique.py's counting pass, side by side (and checked equal). `workers`: one
rank's batches with that transform, built and transformed per batch in one thread, then
as the step gets them from the loader with data.workers 1, 2 and 4 (threads), side by side.
Every figure is one process on one thread; `prepared` needs pyarrow (the `yambda` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrmtrain.comm.dedup import unique  # noqa: E402
from dlrmtrain.comm.dedup.sequence_source import SequenceSourceDedup, ShardingFeatures  # noqa: E402
from dlrmtrain.data.yambda.batch import to_sequence_batch  # noqa: E402
from dlrmtrain.data.yambda.history import HistoryRule  # noqa: E402
from dlrmtrain.data.yambda.loader import SequenceBatchLoader, SequenceLoaderSpec  # noqa: E402
from dlrmtrain.data.yambda.parquet import require_pyarrow, write_parquet  # noqa: E402
from dlrmtrain.data.yambda.preprocess import preprocess_yambda  # noqa: E402
from dlrmtrain.data.yambda.samples import SampleRule, YambdaSamples  # noqa: E402
from dlrmtrain.data.yambda.synthetic import YambdaLikeGenerator, YambdaLikeProfile  # noqa: E402
from dlrmtrain.sequence_features import CROSS_SPECS, TABLES, SequenceBatch  # noqa: E402

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


def prepared_section(a: argparse.Namespace) -> None:
    """Preprocess generated events, build the anchor index, time prepared batches."""
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
    finally:
        shutil.rmtree(tmp)


def synthetic_section(a: argparse.Namespace) -> None:
    for name, profile, batch in (("reference shape", YambdaLikeProfile(), 1024),
                                 ("mini shape", YambdaLikeProfile(num_artists=2000, history_length=128,
                                                                  min_history_fraction=0.5), 128)):
        gen = YambdaLikeGenerator(profile, CROSS_SPECS)
        per = time_batches(lambda b: to_sequence_batch(gen.columns(np.arange(b * batch, (b + 1) * batch))),
                           a.batches)
        print(f"synthetic_yambda {name}, {batch}-sample batch: {per:.3f} s")


def reference_transform(gen: YambdaLikeGenerator) -> SequenceSourceDedup:
    """comm.dedup_at: source's transform for every table of the EC, table-wise (one rank's
    work: the sample rank dedups all of its batch's features whatever the sharding)."""
    rows = gen.table_rows()
    features = [f for _rows, fs in TABLES.values() for f in fs]
    tables = [t for t, (_rows, fs) in TABLES.items() for _f in fs]
    return SequenceSourceDedup([ShardingFeatures("table_wise", features, tables, rows)])


@contextlib.contextmanager
def full_sort():
    """The distinct ids by torch.unique's full sort, per table (unique.py's counting pass off)."""
    small, unique.SMALL = unique.SMALL, sys.maxsize
    try:
        yield
    finally:
        unique.SMALL = small


def _spread(times: list[float]) -> str:
    return f"{statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f})"


def transform_section(a: argparse.Namespace) -> None:
    """Per-table distinct ids and the whole source transform, full sort vs counting, side by
    side on the same reference-shape batches (one rank's 1024 samples)."""
    gen = YambdaLikeGenerator(YambdaLikeProfile(), CROSS_SPECS)
    transform = reference_transform(gen)
    times: dict[str, list[float]] = {k: [] for k in ("ids sort", "ids counting", "transform sort",
                                                      "transform counting")}
    for b in range(a.batches):
        kjt = to_sequence_batch(gen.columns(np.arange((b + 1) * 1024, (b + 2) * 1024))).sparse
        per_feature = kjt.to_dict()
        parts = [([per_feature[f].values() for f in fs], gen.table_rows()[t]) for t, (_r, fs) in TABLES.items()]
        clock = time.thread_time if a.cpu_time else time.perf_counter
        t0 = clock()
        for ids, _rows in parts:
            torch.unique(torch.cat(ids), sorted=True, return_inverse=True)
        t1 = clock()
        for ids, rows in parts:
            unique.DistinctIds(ids, rows).inverse()
        t2 = clock()
        with full_sort():
            want = transform(kjt)
        t3 = clock()
        got = transform(kjt)
        t4 = clock()
        if not (torch.equal(got.values(), want.values()) and all(
                torch.equal(x, y) for x, y in zip(got.expansion.reverse, want.expansion.reverse))):
            raise AssertionError("the counting pass's transform differs from the full sort's")
        for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            times[key].append(dt)
    ids = sum(v.numel() for parts_of_table, _rows in parts for v in parts_of_table)
    print(f"source transform at the reference shape, {ids / 1e6:.2f} M embedded ids per "
          f"1024-sample batch, {a.batches} batches, {'CPU' if a.cpu_time else 'wall'} s (median, min, max):")
    for what in ("ids", "transform"):
        sort, counting = times[f"{what} sort"], times[f"{what} counting"]
        name = "distinct ids, per table" if what == "ids" else "whole transform"
        print(f"  {name}: full sort {_spread(sort)}, counting {_spread(counting)}: "
              f"{statistics.median(sort) / statistics.median(counting):.1f}x")


def _reference_loader(workers: int, prefetch: int) -> SequenceBatchLoader:
    """One rank's synthetic_yambda loader at the reference shape (1024 samples per batch) with
    comm.dedup_at: source's transform, its batches made by `workers` threads."""
    gen = YambdaLikeGenerator(YambdaLikeProfile(), CROSS_SPECS)
    loader = SequenceBatchLoader([np.arange(gen.num_train_samples)], gen.columns, SequenceLoaderSpec(
        rank=0, world_size=1, global_batch_size=1024, slicing="contiguous", prefetch=prefetch, workers=workers))
    loader.sparse_transform = reference_transform(gen)
    return loader


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _per_batch(loader: SequenceBatchLoader, start: int, count: int) -> tuple[float, float]:
    """(seconds per batch as a step that takes them at once gets them, from the loader's start:
    `count` batches cost ~ceil(count / workers) batch times, a multiple of 4 keeps 1, 2, 4 fair;
    the process's CPU seconds over those seconds: how many threads ran at once, GIL included)."""
    batches = loader.batches_from(start)
    try:
        t, cpu = time.perf_counter(), _cpu_seconds()
        for _ in range(count):
            next(batches)
        wall = time.perf_counter() - t
        return wall / count, (_cpu_seconds() - cpu) / wall
    finally:
        batches.close()


def _batch_tensors(batch: SequenceBatch) -> list[torch.Tensor]:
    kjts = [batch.uih, batch.candidates, batch.sparse, *batch.sparse.expansion.features]
    return [t for k in kjts for t in (k.values(), k.lengths())] + list(batch.sparse.expansion.reverse)


def _process_costs(a: argparse.Namespace) -> None:
    """What process workers would cost instead: each batch's tensors copied into shared memory
    to reach the rank (torch.multiprocessing's hand-over), and two processes making batches
    side by side with nothing handed over (the most two processes could give)."""
    loader = _reference_loader(1, prefetch=0)
    batch = next(loader.batches_from(0))
    tensors = _batch_tensors(batch)
    t = time.perf_counter()
    for x in tensors:
        x.share_memory_()
    dt = time.perf_counter() - t
    print(f"  a process worker's hand-over: {sum(x.nbytes for x in tensors) / 1e9:.2f} GB per batch "
          f"copied to shared memory in {dt:.3f} s (threads hand over a reference)")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        t = time.perf_counter()
        pool.starmap(_make_in_process, [(i * a.worker_batches, a.worker_batches // 2) for i in range(2)])
        per = (time.perf_counter() - t) / (2 * (a.worker_batches // 2))
    print(f"  2 processes, each its own batches, nothing handed over: {per:.3f} s per batch")


def _make_in_process(start: int, count: int) -> None:
    torch.set_num_threads(1)
    for _ in _reference_loader(1, prefetch=0).batches_from(start):
        count -= 1
        if count <= 0:
            return


def _parallel_ceiling() -> float:
    """How much faster two threads make GIL-free numpy gathers of a batch's size (8 M ids from
    the item table's 9.4 M rows) than one: the machine's own limit for memory-bound work (shared
    caches and memory bandwidth), against which the workers' figure reads."""
    rng = np.random.default_rng(0)
    table = rng.integers(0, 1 << 40, 9_400_000)
    ids = [rng.integers(0, len(table), 8_000_000) for _ in range(2)]
    gather = lambda i: [np.take(table, ids[i]) for _ in range(3)]  # noqa: E731
    t = time.perf_counter()
    gather(0), gather(1)
    one = time.perf_counter() - t
    threads = [threading.Thread(target=gather, args=(i,)) for i in range(2)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return one / (time.perf_counter() - t)


def workers_section(a: argparse.Namespace) -> None:
    """Per batch at the reference shape, one rank: the batch build and the transform in one
    thread, then the whole per-batch time as the step sees it with 1, 2 and 4 workers, rounds
    interleaved so the machine's load falls on every count alike."""
    gen = YambdaLikeGenerator(YambdaLikeProfile(), CROSS_SPECS)
    transform = reference_transform(gen)
    build, apply = [], []
    clock = time.thread_time if a.cpu_time else time.perf_counter
    for b in range(a.batches):
        t0 = clock()
        kjt = to_sequence_batch(gen.columns(np.arange((b + 1) * 1024, (b + 2) * 1024))).sparse
        t1 = clock()
        transform(kjt)
        build.append(t1 - t0)
        apply.append(clock() - t1)
    print(f"per batch at the reference shape (1024 samples), one thread, {'CPU' if a.cpu_time else 'wall'} s: "
          f"build {_spread(build)}, transform {_spread(apply)}")
    counts = (1, 2, 4)
    times: dict[int, list[float]] = {w: [] for w in counts}
    busy: dict[int, list[float]] = {w: [] for w in counts}
    for r in range(a.rounds):
        for w in counts:  # fresh loaders: no user cached from an earlier count
            per, threads = _per_batch(_reference_loader(w, prefetch=2), r * a.worker_batches, a.worker_batches)
            times[w].append(per)
            busy[w].append(threads)
    base = statistics.median(times[1])
    print(f"build + transform per batch as the step gets it (prefetch 2), {a.rounds} rounds of "
          f"{a.worker_batches} batches (median, min, max):")
    for w in counts:
        print(f"  {w} worker{'s' if w > 1 else ' '}: {_spread(times[w])}, "
              f"{base / statistics.median(times[w]):.2f}x the batches/s of 1; CPU s / wall s "
              f"{statistics.median(busy[w]):.2f}")
    print(f"  (machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; two threads of GIL-free "
          f"numpy gathers alone: {_parallel_ceiling():.2f}x one)")
    _process_costs(a)


SECTIONS = {"prepared": prepared_section, "synthetic": synthetic_section, "transform": transform_section,
            "workers": workers_section}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=2000)
    p.add_argument("--events-per-user", type=int, default=10_000)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="workers: rounds of each worker count")
    p.add_argument("--worker-batches", type=int, default=8, help="workers: batches per round")
    p.add_argument("--cpu-time", action="store_true",
                   help="transform, workers' one-thread figures: the thread's CPU seconds, not the wall's "
                        "(on a loaded machine: what a quiet core would take)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, of {', '.join(SECTIONS)}")
    a = p.parse_args()
    unknown = set(a.sections.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {sorted(unknown)}, choose from {', '.join(SECTIONS)}")
    torch.set_num_threads(1)  # one core per figure, as the loader's thread has
    for name in a.sections.split(","):
        SECTIONS[name](a)


if __name__ == "__main__":
    main()
