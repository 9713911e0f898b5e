"""One prepared device check: what the GPU path needs, in one process, printed as one table.

    PYTHONPATH=. python scripts/gpu_check.py [--device auto|cpu|cuda] [--quick]

Pure torch: it imports neither TorchRec nor fbgemm (an accelerator machine may
have a CUDA build of torch and nothing else; tests/scripts/test_gpu_check.py
runs it with both blocked). Checks, in order:

1. bitwise: every dedup kernel (dlrmtrain/comm/dedup/kernels.py) on the device
   against its CPU result on the same inputs;
2. bf16: the gradient segment-sum of bf16 rows against the fp32 sum rounded
   once (dlrmtrain/precision.py's table) and within 2**-8 of the exact sum;
3. collectives: a world of one initialised as the trainer does
   (`distributed/env.init_distributed`: NCCL on CUDA, Gloo on CPU) running the
   end-of-run comm-stats sums, the AUC gather and the two-level callback
   pattern (a collective's future callback returns tensors only, waited, and
   its value passed through the tensor extraction a CUDA future performs);
4. fixed cost: one rank's codec step (both ends' uniques, the one host sync,
   the plan's indices, gather, expand, segment-sum, scatter) at 2 and 8 ranks:
   kernel launches (CUDA) or ops (CPU) and host syncs, counted;
5. throughput: scripts/bench_codec_kernels.py's kernels at the MLPerf shape
   (26 tables x 4096 bags x dim 128).

Exits 1 if any check fails. `--quick` shrinks every shape; every case runs at both sizes
(CI runs both on CPU, the full size in about 10 s).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

import bench_codec_kernels  # noqa: E402  (scripts/, torch only)
from check_table import Row, report  # noqa: E402  (scripts/, torch-free)

from dlrmtrain.comm.dedup import kernels  # noqa: E402
from dlrmtrain.comm.stats import CommCounters, DistCommStats, collect_comm_stats  # noqa: E402
from dlrmtrain.distributed.env import init_distributed  # noqa: E402
from dlrmtrain.metrics.auc import roc_auc  # noqa: E402


def _jagged(bags: int, longest: int, ids: int, seed: int):
    """(values, offsets, lengths) of `bags` bags of 0..longest ids in [0, ids), with repeats."""
    g = torch.Generator().manual_seed(seed)
    pool = [torch.randint(0, ids, (int(n),), generator=g) for n in torch.randint(0, longest + 1, (bags // 4 + 1,),
                                                                                  generator=g)]
    chosen = torch.randint(0, len(pool), (bags,), generator=g).tolist()
    lengths = torch.tensor([pool[c].numel() for c in chosen], dtype=torch.int64)
    values = torch.cat([pool[c] for c in chosen]) if bags else torch.zeros(0, dtype=torch.int64)
    return values, torch.cumsum(lengths, 0) - lengths, lengths


def _kernel_cases(n: int) -> dict:
    """name -> fn(device) returning the kernel's outputs (inputs made on the CPU, then moved)."""
    one_hot = _jagged(8 * n, 1, 50, seed=1)
    multi = _jagged(n, 4, 20, seed=2)
    wide = _jagged(n, 100, 30, seed=5)
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(4 * n, 16, generator=g) * torch.logspace(-4, 4, 4 * n).unsqueeze(1)
    index = torch.randint(0, n, (4 * n,), generator=g) ** 2 // n
    unique_rows = torch.randn(n, 16, generator=g)
    starts, sizes = [0, n, 3 * n, 4 * n], [n, 2 * n, n, 3 * n]
    # 4n one-hot bags as sorted_unique_one_hot sees them: each bag's id, and whether it has one
    bag_values, bag_offsets, bag_lengths = _jagged(4 * n, 1, 50, seed=6)
    bag_valid = bag_lengths > 0
    bag_ids = torch.zeros(4 * n, dtype=torch.int64)
    bag_ids[bag_valid] = bag_values[bag_offsets[bag_valid]]

    def on(dev, *ts):
        return [t.to(dev) for t in ts]

    def _batched(u: kernels.BlocksUnique):
        valid = torch.arange(u.first.shape[1], device=u.first.device) < u.counts.unsqueeze(1)
        return [u.inverse, torch.where(valid, u.first, -1), u.counts, u.overflow, u.bad_ids]

    def unique(u: kernels.BlockUnique):
        c = int(u.count)
        return [u.inverse, u.first[:c], u.count, u.overflow, u.bad_ids]

    return {
        "block_unique one-hot": lambda d: unique(kernels.block_unique(*on(d, *one_hot), 1, 50)),
        "block_unique multi-hot (width 4)": lambda d: unique(kernels.block_unique(*on(d, *multi), 4, 20)),
        "blocks_unique one-hot (ragged blocks)": lambda d: _batched(kernels.blocks_unique(
            *on(d, *one_hot), starts, sizes, 1, [50] * 4)),
        "blocks_unique one-hot (equal blocks)": lambda d: _batched(kernels.blocks_unique(
            *on(d, *one_hot), [0, 2 * n, 4 * n, 6 * n], [2 * n] * 4, 1, [50] * 4)),
        "blocks_unique multi-hot (width 4, ragged blocks)": lambda d: _batched(kernels.blocks_unique(
            *on(d, *multi), [0, n // 4, n // 2], [n // 4, n // 4, n // 2], 4, [20] * 3)),
        "blocks_unique multi-hot (width 100)": lambda d: _batched(kernels.blocks_unique(
            *on(d, *wide), [0, n // 2], [n // 2, n // 2], 100, [30, 30])),
        "segment_units (ragged widths)": lambda d: [kernels.segment_units(
            index.to(d), [(0, n, 3, 1), (n, 2 * n, 7, 2), (3 * n, 0, 0, 4), (2 * n, n, 1, 3)], 5)],
        "expand_units": lambda d: [kernels.expand_units(
            index[:4 * (n // 4)].view(4, -1).to(d), [(2, 1, 0), (0, 2, 5), (0, 2, 6), (3, 1, 9)])],
        "sorted_unique_one_hot": lambda d: list(kernels.sorted_unique_one_hot(
            *on(d, index % 7, bag_ids, bag_valid), 7, 51)),
        "gather_rows": lambda d: [kernels.gather_rows(*on(d, rows, index))],
        "expand_rows": lambda d: [kernels.expand_rows(*on(d, unique_rows, index))],
        "segment_sum_rows fp32": lambda d: [kernels.segment_sum_rows(*on(d, rows, index), n)],
        "segment_sum_rows bf16": lambda d: [kernels.segment_sum_rows(*on(d, rows.bfloat16(), index), n)],
        "scatter_rows": lambda d: [kernels.scatter_rows(*on(d, torch.zeros(4 * n, 16), index.unique(),
                                                        unique_rows[:index.unique().numel()]))],
    }


def check_bitwise(device: torch.device, n: int) -> list[Row]:
    rows = []
    for name, fn in _kernel_cases(n).items():
        try:
            want = fn(torch.device("cpu"))
            got = fn(device)
            same = len(want) == len(got) and all(
                w.dtype == g.dtype and w.shape == g.shape and torch.equal(w, g.cpu()) for w, g in zip(want, got))
            rows.append(Row("bitwise", name, "ok" if same else "DIFFERS", f"{device.type} == cpu", not same))
        except Exception as e:  # reported in the table, the other checks still run
            rows.append(Row("bitwise", name, "ERROR", f"{type(e).__name__}: {e}"[:90], True))
    return rows


def check_bf16(device: torch.device, n: int) -> list[Row]:
    g = torch.Generator().manual_seed(4)
    index = torch.randint(0, n // 8 + 1, (8 * n,), generator=g) ** 2 // (n // 8 + 1)  # long duplicate runs
    grads = (torch.randn(8 * n, 32, generator=g) * 1e-3).bfloat16()
    segments = n // 8 + 1
    got = kernels.segment_sum_rows(grads.to(device), index.to(device), segments).cpu()
    once = torch.zeros(segments, 32).index_add_(0, index, grads.float()).bfloat16()
    exact = torch.zeros(segments, 32, dtype=torch.float64).index_add_(0, index, grads.double())
    err = ((got.double() - exact).abs() / exact.abs().clamp(min=1e-30)).max().item()
    stepwise = torch.zeros(segments, 32, dtype=torch.bfloat16, device=device).index_add_(
        0, index.to(device), grads.to(device)).cpu()
    step_err = ((stepwise.double() - exact).abs() / exact.abs().clamp(min=1e-30)).max().item()
    same = torch.equal(got, once)
    return [Row("bf16", "segment-sum == fp32 sum rounded once", "ok" if same else "DIFFERS",
                f"{8 * n} rows -> {segments}", not same),
            Row("bf16", "segment-sum vs exact (max rel. error)", f"{err:.2e}",
                f"bound 2**-8 = {2 ** -8:.2e}", err > 2 ** -8),
            Row("bf16", "bf16 index_add_ vs exact (not used)", f"{step_err:.2e}",
                "16-bit accumulator, for comparison")]


class _Counted:
    """One codec dist's counters (`stats.CountsCommBytes`), as the run's registry holds them."""

    def __init__(self, stats: DistCommStats) -> None:
        self._stats = stats

    def counted_bytes(self) -> DistCommStats:
        return self._stats


def check_collectives(device: torch.device) -> list[Row]:
    """A world of one as the trainer makes it; the collectives of the end of a run and of two levels."""
    rows = []
    env = init_distributed(device.type)
    for name, fn in (("comm stats summed over ranks", _stats_sum), ("AUC gather", _auc_gather),
                     ("two-level callback returns tensors", _callback_tensors)):
        try:
            rows.append(Row("collectives", name, "ok", f"{env.backend}: {fn(env.device)}"))
        except Exception as e:  # reported in the table, the other checks still run
            rows.append(Row("collectives", name, "FAIL", f"{env.backend}: {type(e).__name__}: {e}"[:110], True))
    rows.append(_callback_work_refused(env.device, env.backend))
    dist.destroy_process_group()
    return rows


def _stats_sum(device: torch.device) -> str:
    """The trainer's end of run: `collect_comm_stats(counters, all_ranks=True)` (comm/stats.py)."""
    stats = DistCommStats(codec="dedup", sharding_type="table_wise")
    stats.table("t0").add_rows(128, 4, 4, sent=3, received=5, stock_sent=8, stock_received=8, bags=8)
    stats.steps = 1
    counters = CommCounters()
    counters.add(_Counted(stats))
    summary = collect_comm_stats(counters, all_ranks=True)
    got = summary["tables"]["t0"]["bags"]
    if got != 8:
        raise AssertionError(f"bags summed to {got}, want 8")
    return "bags summed exactly"


def _auc_gather(device: torch.device) -> str:
    """Mirrors metrics/auc.gather_eval_outputs, whose all_gather runs only above one rank: the
    stacked (scores, labels, weights) on the device the eval outputs live on, gathered, then AUC."""
    scores = torch.tensor([0.1, 0.9, 0.4, 0.8], device=device)
    labels = torch.tensor([0.0, 1.0, 0.0, 1.0], device=device)
    stacked = torch.stack([scores, labels, torch.ones_like(scores)])
    parts = [torch.empty_like(stacked) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, stacked)
    stacked = torch.cat(parts, dim=1)
    auc = roc_auc(stacked[0], stacked[1])
    if auc != 1.0:
        raise AssertionError(f"AUC {auc}, want 1.0")
    return "AUC 1.0"


def _callback_tensors(device: torch.device) -> str:
    """The two-level pattern made CUDA-safe: an async all-gather whose future callback returns
    tensors only; its value passes the tensor extraction a CUDA future applies, then is waited."""
    mine = torch.arange(4, dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    work = dist.all_gather(everyone, mine, async_op=True)
    future = work.get_future().then(lambda f: [t + 1 for t in _flat(f.value())])  # tensors only
    value = future.wait()
    extracted = torch._jit_internal._extract_tensors(value)
    if len(extracted) != len(everyone) or not torch.equal(extracted[0].cpu(), torch.arange(1, 5)):
        raise AssertionError(f"callback value {value}")
    return f"{len(extracted)} tensor(s) extracted"


def _flat(value) -> list[torch.Tensor]:
    """A collective future's value as a flat list of tensors (backends nest the output list or not)."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


def _callback_work_refused(device: torch.device, backend: str) -> Row:
    """Why the callbacks must not return a Work: a CUDA future cannot extract its tensors."""
    work = dist.all_gather([torch.empty(2, device=device)], torch.ones(2, device=device), async_op=True)
    inner = dist.all_gather([torch.empty(2, device=device)], torch.ones(2, device=device), async_op=True)
    work.wait()
    inner.wait()
    try:
        torch._jit_internal._extract_tensors(inner)
        return Row("collectives", "a Work as callback value", "EXTRACTED", "expected a refusal", True)
    except Exception as e:  # the refusal a CUDA future's wait() would raise
        return Row("collectives", "a Work as callback value", "refused", f"as expected ({type(e).__name__})")


def codec_step(device: torch.device, world: int, batch: int, tables: int, dim: int, distinct: float):
    """One rank's table-wise codec step as TableWisePlanner.plan / _build_plan and the transport
    (dedup/transport.py) make it, from the same kernels: both ends' uniques (one `blocks_unique` call
    each), the one host sync, the two plan indices, gather, expand, segment-sum, scatter."""
    local = -(-tables // world)
    ids, _, _, _ = bench_codec_kernels.make_blocks(max(tables, local * world), batch, distinct)
    ids = ids.to(device)
    lengths = torch.ones(ids.numel(), dtype=torch.int64, device=device)
    offsets = torch.arange(ids.numel() + 1, device=device)
    nums = [max(1, int(distinct * batch))]
    local_embs = torch.randn(local * world * batch, dim, device=device)
    pool = torch.empty(local * world * batch, dim, device=device)

    def step():
        owner = kernels.blocks_unique(ids, offsets, lengths, [k * batch for k in range(local * world)],
                                      [batch] * (local * world), 1, nums * (local * world))
        sample = kernels.blocks_unique(ids, offsets, lengths, [k * batch for k in range(tables)],
                                       [batch] * tables, 1, nums * tables)
        flat = torch.cat([torch.stack([u.counts, u.overflow.long(), u.bad_ids.long()]) for u in (owner, sample)], 1)
        counts = flat.tolist()[0]  # the step's one host sync
        source = torch.cat([owner.first.reshape(-1), torch.arange(batch, device=device)])
        segments = [((i * world + s) * batch, counts[i * world + s], s * batch * local + i, 1)
                    for s in range(world) for i in range(local)]
        send_index = kernels.segment_units(source, segments, local)
        base = [sum(counts[local * world:local * world + j]) for j in range(tables)]
        recv_index = kernels.expand_units(sample.inverse.view(tables, batch), [(j, 1, base[j]) for j in range(tables)])
        received = sum(counts[local * world:])
        rows = kernels.gather_rows(local_embs, send_index)  # owner, forward: the unique rows it sends
        recv = rows.new_empty(received, dim)  # what the all-to-all fills
        out = kernels.expand_rows(recv, recv_index)  # receiver, forward
        kernels.segment_sum_rows(out, recv_index, received)  # receiver, backward
        # owner, backward: the gradient sums it receives have its sent rows' shape
        kernels.scatter_rows(pool.index_fill_(0, send_index, 0), send_index, rows)
    return step


def _count_step(step, device: torch.device) -> tuple[int, int]:
    """(kernel launches on CUDA, or aten ops on CPU; host syncs) of one call of `step` after a warm-up."""
    step()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught, torch.profiler.profile(activities=activities) as prof:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
                torch.cuda.synchronize()
    events = prof.key_averages()
    if device.type == "cuda":
        launches = sum(e.count for e in events if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel",
                                                                     "cudaMemcpyAsync", "cudaMemsetAsync")))
        syncs = sum(1 for w in caught if "synchroniz" in str(w.message))
        return launches, syncs
    top = [e for e in prof.events() if e.name.startswith("aten::") and
           (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return len(top), 1  # CPU: the step's one explicit read (`.tolist()`)


def check_fixed_cost(device: torch.device, quick: bool) -> list[Row]:
    """Launches and host syncs of one codec step at 2 and 8 ranks (same per-rank batch), and its
    wall time at a tiny batch (where the fixed cost is all there is)."""
    rows, launches = [], {}
    unit = "launches" if device.type == "cuda" else "ops"
    for world in (2, 8):
        step = codec_step(device, world, 64 if quick else 4096, 26, 8 if quick else 128, 0.22)
        launches[world], syncs = _count_step(step, device)
        rows.append(Row("fixed cost", f"codec step, {world} ranks: {unit}", str(launches[world]),
                        f"host syncs {syncs}", syncs != 1))
    tiny = codec_step(device, 8, 16, 26, 8, 0.5)
    ms = bench_codec_kernels.time_call(tiny, device, 3 if quick else 20)
    rows.append(Row("fixed cost", "codec step, 8 ranks x 16 bags: ms", f"{ms:.3f}", "launch-bound"))
    grows = launches[8] != launches[2]
    rows.append(Row("fixed cost", f"{unit} independent of world size", "no" if grows else "yes",
                    f"2 ranks {launches[2]}, 8 ranks {launches[8]}", grows))
    return rows


def check_throughput(device: torch.device, quick: bool) -> list[Row]:
    """scripts/bench_codec_kernels.py's kernels, at MLPerf's shape unless `quick`."""
    args = SimpleNamespace(tables=3 if quick else 26, batch_size=64 if quick else 4096, dim=8 if quick else 128,
                           distinct=0.22, repeats=1 if quick else 10, sample_ranks=2)
    return [Row("throughput", name, f"{ms:.3f} ms", f"{gbps:.1f} GB/s" if gbps is not None else "")
            for name, ms, gbps in bench_codec_kernels.bench_device(device, args)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--quick", action="store_true", help="small shapes, one repeat (CI on CPU: seconds)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gpu_check: {label}, torch {torch.__version__}{' (quick)' if args.quick else ''}")
    t0 = time.perf_counter()
    n = 64 if args.quick else 4096
    rows = check_bitwise(device, n) + check_bf16(device, n) + check_collectives(device)
    rows += check_fixed_cost(device, args.quick) + check_throughput(device, args.quick)
    return report(rows, t0)


if __name__ == "__main__":
    sys.exit(main())
