"""Time the dedup codec's pure-torch kernels (unique, gather, expand, segment-sum, scatter) per device.

    PYTHONPATH=. python scripts/bench_codec_kernels.py --batch-size 4096 --tables 26 --dim 128

Exactly the functions training runs (dlrmtrain/comm/dedup/kernels.py;
tests/comm/test_kernel_bench.py checks that the two sets agree), importing
torch alone (no TorchRec, no fbgemm), on one rank's worth of one-hot blocks: `--tables` features of `--batch-size` bags
whose ids repeat so that about `--distinct` of them are distinct (the real
Kaggle sample at batch 4096: 0.22). Runs on CPU and, when CUDA is available, on
the GPU (timed with CUDA events after a warm-up); `--devices` picks. Prints
milliseconds per call (median of `--repeats`) and the effective memory
bandwidth of expand and segment-sum (bytes read + written / time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch

from dlrmtrain.comm.dedup.kernels import (
    blocks_unique,
    expand_rows,
    expand_units,
    gather_rows,
    host_to_device,
    scatter_rows,
    segment_sum_rows,
    segment_units,
    sorted_unique_one_hot,
)

DCNV2_WIDTHS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
"""MLPerf DCNv2's multi-hot bag sizes per feature (docs/design.md's table)"""


def make_blocks(tables: int, batch: int, distinct: float, seed: int = 0):
    """KJT parts of `tables` one-hot features of `batch` bags, ~distinct·batch distinct ids each."""
    g = torch.Generator().manual_seed(seed)
    pool = max(1, int(distinct * batch))
    # ids drawn from a pool of `pool` values, each seen at least once: U == pool
    ids = torch.cat([torch.cat([torch.arange(pool), torch.randint(0, pool, (batch - pool,), generator=g)])
                     [torch.randperm(batch, generator=g)] for _ in range(tables)])
    lengths = torch.ones(tables * batch, dtype=torch.int64)
    offsets = torch.arange(tables * batch + 1, dtype=torch.int64)
    return ids, offsets, lengths, pool


def time_call(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of fn() after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_device(device: torch.device, args) -> list[tuple[str, float, float | None]]:
    T, B, D = args.tables, args.batch_size, args.dim
    ids, offsets, lengths, pool = make_blocks(T, B, args.distinct)
    ids, offsets, lengths = ids.to(device), offsets.to(device), lengths.to(device)
    starts, sizes, nums = [t * B for t in range(T)], [B] * T, [pool] * T
    uniques = blocks_unique(ids, offsets, lengths, starts, sizes, 1, nums).split()
    U = int(uniques[0].count)
    inverse = torch.cat([u.inverse + t * U for t, u in enumerate(uniques)])  # all tables' rows stacked
    rows = torch.randn(T * U, D, device=device)
    out = torch.empty(T * B, D, device=device)
    grads = torch.randn(T * B, D, device=device)
    elem = rows.element_size()
    results = []
    ms = time_call(lambda: blocks_unique(ids, offsets, lengths, starts, sizes, 1, nums), device, args.repeats)
    results.append((f"unique ({T} blocks x {B} ids, one sort)", ms, None))
    ms = time_call(lambda: blocks_unique(ids, offsets, lengths, [0], [B], 2, [pool]), device, args.repeats)
    results.append((f"unique multi-hot path (1 block x {B} bags, width 2)", ms, None))
    results.append(_multi_hot(device, args))
    # row-wise: (group, id) keys of all blocks in one sort
    groups = torch.arange(T, device=device).repeat_interleave(B)
    valid = torch.ones(T * B, dtype=torch.bool, device=device)
    num_rows = host_to_device([pool], device)
    ms = time_call(lambda: sorted_unique_one_hot(groups, ids % num_rows, valid, T, pool), device, args.repeats)
    results.append((f"unique row-wise ({T} groups x {B} ids, one sort)", ms, None))
    firsts = torch.cat([u.first[:U] + t * B for t, u in enumerate(uniques)])  # the rows an owner sends
    ms = time_call(lambda: gather_rows(out, firsts), device, args.repeats)
    results.append((f"gather [{T * B}, {D}] -> [{T * U}, {D}]", ms,
                    2 * T * U * D * elem / (ms * 1e-3) / 1e9))
    ms = time_call(lambda: expand_rows(rows, inverse, out=out), device, args.repeats)
    results.append((f"expand [{T * U}, {D}] -> [{T * B}, {D}] (reused out)", ms,
                    (T * U * D + T * B * D) * elem / (ms * 1e-3) / 1e9))
    ms = time_call(lambda: segment_sum_rows(grads, inverse, T * U), device, args.repeats)
    results.append((f"segment-sum [{T * B}, {D}] -> [{T * U}, {D}]", ms,
                    (T * B * D + T * U * D) * elem / (ms * 1e-3) / 1e9))
    grad_local = torch.zeros(T * B, D, device=device)
    ms = time_call(lambda: scatter_rows(grad_local.zero_(), firsts, rows), device, args.repeats)
    results.append((f"zero + scatter [{T * U}, {D}] -> [{T * B}, {D}]", ms,
                    (T * B * D + 2 * T * U * D) * elem / (ms * 1e-3) / 1e9))
    results += _plan_indices(device, uniques, T, B, U)
    return results


def _multi_hot(device: torch.device, args) -> tuple[str, float, None]:
    """DCNv2's multi-hot features (bags of a fixed function of one id), every width's blocks keyed
    together: one `blocks_unique` call per width, as the table-wise planner makes them."""
    B, W = args.batch_size, args.sample_ranks
    widths = sorted({w for w in DCNV2_WIDTHS if w > 1})
    g = torch.Generator().manual_seed(1)
    calls = []
    for w in widths:
        blocks = W * sum(1 for x in DCNV2_WIDTHS if x == w)
        lookup = torch.randint(0, 40_000_000, (max(1, int(args.distinct * B)), w), generator=g)
        values = lookup[torch.randint(0, lookup.shape[0], (blocks * B,), generator=g)].reshape(-1).to(device)
        lengths = torch.full((blocks * B,), w, dtype=torch.int64, device=device)
        offsets = torch.arange(blocks * B + 1, device=device) * w
        calls.append((values, offsets, lengths, [k * B for k in range(blocks)], [B] * blocks, w,
                      [40_000_000] * blocks))
    ms = time_call(lambda: [blocks_unique(*c) for c in calls], device, args.repeats)
    return (f"unique multi-hot DCNv2 ({W} ranks x {B} bags, {len(widths)} widths)", ms, None)


def _plan_indices(device: torch.device, uniques, T: int, B: int, U: int) -> list[tuple[str, float, None]]:
    """The plan's send and expand indices of one rank owning all `T` tables, one sample rank."""
    source = torch.cat([torch.stack([u.first for u in uniques]).reshape(-1), torch.arange(B, device=device)])
    segments = [(t * B, U, t, 1) for t in range(T)]
    inverse = torch.stack([u.inverse for u in uniques])
    columns = [(t, 1, t * U) for t in range(T)]
    return [(f"plan send index ({T} segments)", time_call(lambda: segment_units(source, segments, T), device, 3),
             None),
            (f"plan expand index ([{B}, {T}])", time_call(lambda: expand_units(inverse, columns), device, 3), None)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=4096, help="bags per block (local batch)")
    ap.add_argument("--tables", type=int, default=26)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--distinct", type=float, default=0.22, help="distinct fraction per block, (0, 1]")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--sample-ranks", type=int, default=2, help="blocks per multi-hot feature (DCNv2 line)")
    ap.add_argument("--devices", nargs="+", default=None, help="cpu and/or cuda (default: all available)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (this machine: 2 shared cores)")
    args = ap.parse_args(argv)
    if not 0 < args.distinct <= 1:
        raise SystemExit(f"--distinct: must be in (0, 1], got {args.distinct}")
    torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    if "cuda" in devices and not torch.cuda.is_available():
        raise SystemExit("--devices cuda: no CUDA device here")
    print(f"dedup kernels: {args.tables} one-hot blocks x {args.batch_size} bags, dim {args.dim}, "
          f"distinct {args.distinct}; median of {args.repeats} (CPU threads {args.threads})")
    if "cuda" not in devices:
        print("(no GPU here: CPU only)")
    for name in devices:
        device = torch.device(name)
        label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        print(f"\n{label}")
        print(f"  {'kernel':<52} {'ms':>9} {'GB/s':>8}")
        for kernel, ms, gbps in bench_device(device, args):
            print(f"  {kernel:<52} {ms:>9.3f} {gbps if gbps is not None else float('nan'):>8.1f}")


if __name__ == "__main__":
    sys.exit(main())
