"""Data-path throughput: raw-text preprocessing (MB/s per process) and the loader (samples/s per process).

    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_data.py [--text-mb 200] [--rows 4000000]
    OMP_NUM_THREADS=1 PYTHONPATH=. python scripts/bench_data.py --distinct-bags 8192 [--rounds 3]

Preprocessing input is the real Kaggle sample (criteo_kaggle_sample.tsv.gz in the folder
$DLRMTRAIN_SHARED_DATA) repeated to --text-mb of text, or synthetic rows when the sample is
absent. MB are of uncompressed text; every figure is one process (workers=1).
The loader reads a preprocessed file of --rows rows (default ~630 MB, far more than
the few warm-up batches) at global batch 32768: one full pass with the page cache
warm, and one after evicting the files from the page cache (posix_fadvise
DONTNEED) so pages come from the disk ("cold").
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrmtrain.data.formats.binary import PartWriter, finished_part_meta, write_manifest  # noqa: E402
from dlrmtrain.data.formats.criteo_text import iter_parsed  # noqa: E402
from dlrmtrain.features import MLPERF_DCNV2_MULTI_HOT_SIZES  # noqa: E402
from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec  # noqa: E402
from dlrmtrain.data.preprocess.multi_hot import MultiHotLookup, MultiHotPart  # noqa: E402
from dlrmtrain.data.preprocess.pipeline import preprocess  # noqa: E402
from dlrmtrain.data.sources import open_parts  # noqa: E402
from dlrmtrain.data.synthetic.profiles import terabyte_sizes  # noqa: E402

BATCH = 32768


def make_text(tmp: Path, megabytes: float) -> tuple[Path, str]:
    folder = os.environ.get("DLRMTRAIN_SHARED_DATA")
    sample = Path(folder) / "criteo_kaggle_sample.tsv.gz" if folder else None
    if sample is not None and sample.exists():
        block, origin = gzip.open(sample).read(), f"real Kaggle sample ({sample}) repeated"
    else:
        from tests.data.raw_rows import random_raw_lines

        block, origin = ("\n".join(random_raw_lines(20000, n_distinct=5000)) + "\n").encode(), "synthetic rows"
    path = tmp / "day_0"
    with open(path, "wb") as f:
        while f.tell() < megabytes * 1e6:
            f.write(block)
    return path, origin


class Clock:
    """Wall time and this process's CPU time of a block.

    On a shared machine wall time depends on the neighbours; CPU seconds (all threads of
    this process) are what the work itself costs, so both are printed.
    """

    def __enter__(self) -> "Clock":
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0


def timed(fn, repeats: int = 1) -> Clock:
    """Best of `repeats` runs (by wall time): the least disturbed one."""
    best = None
    for _ in range(repeats):
        with Clock() as clock:
            fn()
        if best is None or clock.wall < best.wall:
            best = clock
    return best


def rate(amount: float, clock: Clock, unit: str) -> str:
    return f"{amount / clock.wall:7.1f} {unit}/s wall  {amount / clock.cpu:7.1f} {unit}/CPU-s"


def bench_preprocessing(tmp: Path, megabytes: float) -> None:
    text, origin = make_text(tmp, megabytes)
    mb = text.stat().st_size / 1e6
    with open(text, "rb") as src, gzip.open(tmp / "day_gz.gz", "wb", compresslevel=1) as dst:
        shutil.copyfileobj(src, dst)
    print(f"\n== preprocessing: {mb:,.0f} MB of raw text ({origin}), 1 process, best of 2 where marked ==")
    sizes = [1 << 20] * 26
    parse = timed(lambda: sum(len(c) for c in iter_parsed(text)), repeats=2)

    def hash_run() -> None:
        shutil.rmtree(tmp / "hash", ignore_errors=True)
        preprocess([text], tmp / "hash", "hash", sizes, progress=False)

    hash_mode = timed(hash_run, repeats=2)
    hash_gz = timed(lambda: preprocess([tmp / "day_gz.gz"], tmp / "hash_gz", "hash", sizes, progress=False))
    vocab = timed(lambda: preprocess([text], tmp / "vocab", "mlperf_vocab", progress=False))
    print(f"  parse only (vectorised, no output)       {rate(mb, parse, 'MB')}  (best of 2)")
    print(f"  hash mode, plain text: parse+map+write   {rate(mb, hash_mode, 'MB')}  (best of 2)")
    print(f"  hash mode, .gz input (MB of text)        {rate(mb, hash_gz, 'MB')}")
    print(f"  mlperf_vocab, both passes end to end     {rate(mb, vocab, 'MB')}  (text parsed once)")
    # The vocabulary pass has a fixed cost per file (1 GB of per-column flags to clear and
    # scan, the 130 MB vocabulary to build and save) that a 46 GB day amortises: measure it
    # on a one-line file and report the rate beyond it.
    one_line = tmp / "one_line"
    with open(text, "rb") as f:
        one_line.write_bytes(f.readline())
    fixed = timed(lambda: preprocess([one_line], tmp / "vocab_fixed", "mlperf_vocab", progress=False))
    marginal = Clock()
    marginal.wall, marginal.cpu = vocab.wall - fixed.wall, vocab.cpu - fixed.cpu
    print(f"  mlperf_vocab beyond its fixed per-file cost ({fixed.cpu:.1f} CPU-s, {fixed.wall:.1f} s wall): "
          f"{rate(mb, marginal, 'MB')}")
    for d in ("hash", "hash_gz", "vocab", "vocab_fixed"):
        shutil.rmtree(tmp / d)
    text.unlink()


def write_loader_file(root: Path, rows: int) -> None:
    rng = np.random.default_rng(0)
    chunk = 1 << 20
    writer = PartWriter(root, "day_0")
    for lo in range(0, rows, chunk):
        n = min(chunk, rows - lo)
        writer.append(rng.random((n, 13), dtype=np.float32), rng.integers(0, 1 << 24, (n, 26), dtype=np.int32),
                      rng.integers(0, 2, n).astype(np.uint8))
    writer.commit({"source": None})
    write_manifest(root, {"categorical_mode": "hash", "table_sizes": [1 << 24] * 26, "rows": rows,
                          "parts": [finished_part_meta(root, "day_0")]})


def evict_from_page_cache(root: Path) -> None:
    for path in (root / "parts").rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def one_pass(root: Path, prefetch: int, rank: int = 0, world: int = 1) -> tuple[int, Clock]:
    loader = CriteoBatchLoader(open_parts(root), CriteoLoaderSpec(BATCH * world, rank, world, prefetch=prefetch))
    n = 0
    with Clock() as clock:
        for batch in loader:
            n += batch.labels.shape[0]
    return n, clock


def bench_loader(tmp: Path, rows: int) -> None:
    root = tmp / "loader"
    write_loader_file(root, rows)
    size_mb = sum(p.stat().st_size for p in (root / "parts").rglob("*") if p.is_file()) / 1e6
    print(f"\n== loader: {rows:,} rows ({size_mb:,.0f} MB on disk), local batch {BATCH}, 1 process ==")
    for prefetch in (0, 2):
        one_pass(root, prefetch)  # warm the page cache with a full pass
        n, warm = one_pass(root, prefetch)
        evict_from_page_cache(root)
        _, cold = one_pass(root, prefetch)
        print(f"  prefetch {prefetch}, warm cache  {rate(n / 1e6, warm, 'M samples')}")
        print(f"  prefetch {prefetch}, cold cache  {rate(n / 1e6, cold, 'M samples')}  (cold/warm wall {cold.wall / warm.wall:.2f}x)")
    n, clock = one_pass(root, 2, rank=1, world=2)
    print(f"  rank 1 of 2, its half of each global batch: {rate(n / 1e6, clock, 'M samples')}")
    bench_multi_hot(root)


def bench_multi_hot(root: Path, max_batches: int = 30) -> None:
    """DCNv2 bags (MLPerf sizes, 214 ids per sample) made at load time from the one-hot file."""
    sizes = terabyte_sizes("dcnv2", 0.01)  # lookup tables at 1 % of MLPerf rows (~0.3 GB)
    lookup = MultiHotLookup(sizes, MLPERF_DCNV2_MULTI_HOT_SIZES)
    parts = [MultiHotPart(p, lookup) for p in open_parts(root)]
    loader = CriteoBatchLoader(parts, CriteoLoaderSpec(BATCH, prefetch=2))
    n = 0
    with Clock() as clock:
        for i, batch in enumerate(loader):
            n += batch.labels.shape[0]
            if i + 1 == max_batches:
                break
    print(f"  multi-hot DCNv2 bags made at load time ({sum(MLPERF_DCNV2_MULTI_HOT_SIZES)} ids/sample): "
          f"{rate(n / 1e6, clock, 'M samples')}")


def bench_distinct_bags(batch: int, rounds: int) -> None:
    """comm.dedup_at: source's distinct bags (comm/dedup/source.py) on one rank's MLPerf DCNv2
    multi-hot batch (terabyte tables, power-law ids, MLPerf bag sizes), its per-feature row
    unique by torch.unique(dim=0) vs comm/dedup/unique.py's lexsort, side by side, checked equal."""
    import statistics

    import torch
    from torchrec import KeyedJaggedTensor

    from dlrmtrain.comm.dedup import source
    from dlrmtrain.data.synthetic.generator import multi_hot_offsets, power_law_ids
    from dlrmtrain.data.synthetic.profiles import terabyte_profile

    torch.set_num_threads(1)
    sizes, exponents = terabyte_profile("dcnv2", 1.0)
    offsets = multi_hot_offsets(sizes, MLPERF_DCNV2_MULTI_HOT_SIZES, seed=0)
    by_sort = lambda rows: torch.unique(rows, dim=0, sorted=True, return_inverse=True)  # noqa: E731
    times: dict[str, list[float]] = {"torch.unique(dim=0)": [], "lexsort": []}
    for r in range(rounds):
        rng = np.random.default_rng(r)
        bags = [(power_law_ids(rng, n, e, batch)[:, None] + off) % n for n, e, off in zip(sizes, exponents, offsets)]
        kjt = KeyedJaggedTensor(
            keys=[f"cat_{t}" for t in range(len(bags))],
            values=torch.from_numpy(np.concatenate([b.reshape(-1) for b in bags])),
            lengths=torch.cat([torch.full((batch,), b.shape[1], dtype=torch.int32) for b in bags]), stride=batch)
        made = {}
        for name, unique_rows in (("torch.unique(dim=0)", by_sort), ("lexsort", source.unique_rows)):
            kept, source.unique_rows = source.unique_rows, unique_rows
            try:
                t = time.perf_counter()
                made[name] = source.distinct_bags(kjt)
                times[name].append(time.perf_counter() - t)
            finally:
                source.unique_rows = kept
        a, b = made.values()
        if not (torch.equal(a.values(), b.values()) and torch.equal(a.inverse_indices()[1], b.inverse_indices()[1])):
            raise AssertionError("lexsort's distinct bags differ from torch.unique's")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"distinct bags of one rank's DCNv2 multi-hot batch ({batch} samples, "
          f"{sum(MLPERF_DCNV2_MULTI_HOT_SIZES)} ids/sample), {rounds} rounds, median (min-max): " + ", ".join(
              f"{k} {med[k]:.3f} s ({min(v):.3f}-{max(v):.3f})" for k, v in times.items())
          + f": {med['torch.unique(dim=0)'] / med['lexsort']:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text-mb", type=float, default=200.0, help="raw text to preprocess")
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows in the loader's file")
    ap.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    ap.add_argument("--distinct-bags", type=int, default=0, metavar="BATCH",
                    help="only time comm.dedup_at: source's distinct bags on a DCNv2 multi-hot batch of BATCH")
    ap.add_argument("--rounds", type=int, default=3, help="--distinct-bags: batches timed")
    args = ap.parse_args()
    if args.distinct_bags:
        bench_distinct_bags(args.distinct_bags, args.rounds)
        return
    print("command: OMP_NUM_THREADS=%s python %s" % (os.environ.get("OMP_NUM_THREADS", "unset"), " ".join(sys.argv)))
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        bench_preprocessing(Path(tmp), args.text_mb)
        bench_loader(Path(tmp), args.rows)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
