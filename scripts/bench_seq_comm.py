"""Sequence-embedding all-to-all bytes per codec at the MLPerf DLRMv4 reference's in-batch unique rates.

    PYTHONPATH=. python scripts/bench_seq_comm.py
    PYTHONPATH=. python scripts/bench_seq_comm.py --batch 8 --seq-len 2048 --sharding row_wise

DLRMv4 (HSTU on Yambda) embeds every history position with an unpooled
EmbeddingCollection, so its embedding all-to-all carries one row per id
position. The reference's config reports in-batch unique rates of 2.4 % (item),
1.5 % (album) and 0.6 % (artist). This script builds each rank's batch with
exactly those distinct fractions per table (all features sharing the table:
history and candidate), the distinct ids drawn at random from the table and
their positions Zipf-skewed, shards the EC from DLRMv4's table layout
(`sequence_features.TABLES`, rows capped by `--row-cap`, dim `--dim`) on real
Gloo ranks with the package's own builder (`shard_sequence_model`), and runs
training steps (fused RowWiseAdagrad) under `none`, `dedup` and the LOSSY
`dedup+fp16`: the reference default (index dedup + fp16, LOSSY), the wire its gin
runs (TorchRec's EC index dedup with fp16 quantized comms).

Printed per table and in total (bytes from the codec's counters, summed over
ranks; `none`'s bytes are what TorchRec's `SequenceEmbeddingsAllToAll` moves,
one row per position, = dedup's `uncompressed` counter):
- payload ratio `none` / `dedup` (forward; backward moves the same rows back),
- the ideal distinct-row ratio positions / distinct rows, counted from the ids
  here, and payload ratio / ideal,
- lossless `dedup`'s bytes over the reference default's (`dedup+fp16`: the same distinct
  rows at half the width, so about 2),
- the whole step's scope with the id all-to-all, projected to the reference's
  dim 512 (payload scales with the dim, the ids do not).
Step times on loopback (a memcpy "network") are printed side by side for
orientation, never asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import time

import numpy as np

UNIQUE_RATES = {"item_id": 0.024, "album_id": 0.015, "artist_id": 0.006}
"""the reference's reported in-batch unique rates (distinct ids / positions per batch)"""
REFERENCE_DIM = 512
CODECS = ("none", "dedup", "dedup+fp16")


def ids_with_unique_rate(n: int, rate: float, rows: int, rng: np.random.Generator, zipf: float) -> np.ndarray:
    """`n` ids from [0, rows) with exactly round(rate·n) distinct values, Zipf-skewed repeats."""
    distinct = min(max(1, round(rate * n)), n, rows)
    pool = rng.choice(rows, size=distinct, replace=False)
    weights = 1.0 / np.arange(1, distinct + 1) ** zipf
    picks = np.concatenate([np.arange(distinct), rng.choice(distinct, size=n - distinct, p=weights / weights.sum())])
    return pool[rng.permutation(picks)]


def rank_batch(args, rank: int) -> dict[str, list[np.ndarray]]:
    """Per feature, per sample: its ids (jagged histories of length in [L/2, L], one candidate each)."""
    from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES, TABLES

    rng = np.random.default_rng(1000 + rank)
    lengths = rng.integers(args.seq_len // 2, args.seq_len + 1, size=args.batch)
    out: dict[str, list[np.ndarray]] = {}
    for table, (rows, features) in TABLES.items():
        rows = min(rows, args.row_cap)
        sizes = [lengths if f not in CONTEXTUAL_FEATURES and not f.startswith("item_candidate") else
                 np.ones(args.batch, dtype=np.int64) for f in features]
        rate = UNIQUE_RATES.get(table, args.context_unique)
        ids = ids_with_unique_rate(int(sum(s.sum() for s in sizes)), rate, rows, rng, args.zipf)
        start = 0
        for f, s in zip(features, sizes):
            out[f] = []
            for n in s:
                out[f].append(ids[start:start + n])
                start += n
    return out


def _kjt(batch: dict[str, list[np.ndarray]]):
    import torch
    from torchrec import KeyedJaggedTensor

    keys = list(batch)
    values = np.concatenate([seq for k in keys for seq in batch[k]])
    lengths = [len(seq) for k in keys for seq in batch[k]]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.from_numpy(values.astype(np.int64)),
                                               lengths=torch.tensor(lengths, dtype=torch.int64))


def _rank_main(rank: int, world: int, port: int, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torchrec import EmbeddingCollection, EmbeddingConfig

    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.comm.stats import collect_comm_stats
    from dlrmtrain.config.schema import CommConfig, ShardingConfig
    from dlrmtrain.distributed.env import shutdown_distributed
    from dlrmtrain.distributed.sharding import rowwise_adagrad_fused_params, shard_sequence_model
    from dlrmtrain.sequence_features import TABLES

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    kjt = _kjt(rank_batch(args, rank))
    out = {}
    for codec in CODECS:
        class Model(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ec = EmbeddingCollection(tables=[
                    EmbeddingConfig(name=t, embedding_dim=args.dim, num_embeddings=min(rows, args.row_cap),
                                    feature_names=list(fs)) for t, (rows, fs) in TABLES.items()],
                    device=torch.device("meta"))

            def forward(self, features):
                return self.ec(features)

        torch.manual_seed(1234)
        dmp, _, counters = shard_sequence_model(Model(), "ec", ShardingConfig(default_type=args.sharding),
                                      Placement(CommConfig(codec=codec, dedup_at="owner"), "sequence"),
                                      rowwise_adagrad_fused_params(0.01, 1e-8),
                                      torch.device("cpu"), world)
        times = []
        for step in range(args.warmup + args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            res = dmp(kjt)
            res = res.wait() if hasattr(res, "wait") else res
            sum(jt.values().sum() for jt in res.values()).backward()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        stats = collect_comm_stats(counters, all_ranks=True)
        step_time = torch.tensor([float(np.mean(times))])
        dist.all_reduce(step_time, op=dist.ReduceOp.MAX)  # the slowest rank sets a collective step's pace
        out[codec] = {"stats": stats, "step_s": step_time.item()}
        dist.barrier()
        del dmp, res
        gc.collect()
    if rank == 0:
        queue.put(out)
    shutdown_distributed()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, args.world_size, port, args, queue))
             for r in range(args.world_size)]
    for p in procs:
        p.start()
    result = queue.get(timeout=1800)
    for p in procs:
        p.join(120)
        if p.exitcode != 0:
            raise SystemExit(f"rank exited with {p.exitcode}")
    return result


def ideal_counts(args) -> dict[str, tuple[int, int]]:
    """Per table: (positions, distinct ids per rank summed over ranks), counted from the ids alone."""
    from dlrmtrain.sequence_features import TABLES

    table_of = {f: t for t, (_r, fs) in TABLES.items() for f in fs}
    counts: dict[str, list[int]] = {t: [0, 0] for t in TABLES}
    for rank in range(args.world_size):
        seen: dict[str, set] = {t: set() for t in TABLES}
        for f, seqs in rank_batch(args, rank).items():
            counts[table_of[f]][0] += sum(len(s) for s in seqs)
            for s in seqs:
                seen[table_of[f]].update(s.tolist())
        for t in TABLES:
            counts[t][1] += len(seen[t])
    return {t: (p, d) for t, (p, d) in counts.items()}


def report(args, result: dict) -> str:
    from dlrmtrain.mlperf.benchmarks import REFERENCE_DEFAULT_NAME
    ideal = ideal_counts(args)
    dedup, lossy = result["dedup"]["stats"], result["dedup+fp16"]["stats"]
    lines = [f"sequence all-to-all, {args.world_size} Gloo ranks, {args.sharding}, local batch {args.batch}, "
             f"history length {args.seq_len // 2}..{args.seq_len}, dim {args.dim}, {args.steps} timed steps "
             f"(bytes per step, all ranks, forward; backward the same rows back)",
             f"{'table':<22} {'positions':>9} {'distinct':>8} {'none MiB':>9} {'dedup MiB':>9} {'ratio':>7} "
             f"{'ideal':>7} {'/ideal':>6} {'/ref':>6}"]
    steps = dedup["steps"]  # forward passes (warm-up included: every pass carries the same batch)
    tot_none = tot_dedup = tot_pos = tot_distinct = 0
    for t, row in dedup["tables"].items():
        positions, distinct = ideal[t]
        none_b = row["uncompressed_fwd_recv_bytes"] / steps
        dedup_b = row["payload_fwd_recv_bytes"] / steps
        ref_b = lossy["tables"][t]["payload_fwd_recv_bytes"] / lossy["steps"]
        tot_none, tot_dedup = tot_none + none_b, tot_dedup + dedup_b
        tot_pos, tot_distinct = tot_pos + positions, tot_distinct + distinct
        ratio, best = none_b / dedup_b, positions / distinct
        lines.append(f"{t:<22} {positions:>9} {distinct:>8} {none_b / 2**20:>9.3f} {dedup_b / 2**20:>9.3f} "
                     f"{ratio:>6.1f}x {best:>6.1f}x {ratio / best:>6.3f} {dedup_b / ref_b:>5.2f}x")
    ratio, best = tot_none / tot_dedup, tot_pos / tot_distinct
    lossy_b = lossy["total"]["payload_fwd_recv_bytes"] / lossy["steps"]
    lines.append(f"{'total':<22} {tot_pos:>9} {tot_distinct:>8} {tot_none / 2**20:>9.3f} {tot_dedup / 2**20:>9.3f} "
                 f"{ratio:>6.1f}x {best:>6.1f}x {ratio / best:>6.3f} {tot_dedup / lossy_b:>5.2f}x")
    ids = dedup["total"]["id_recv_bytes"] / steps
    row_full = REFERENCE_DIM * 4 / (args.dim * 4)
    lines += [
        f"payload: dedup moves {ratio:.1f}x fewer bytes than none fp32 (ideal distinct-row ratio {best:.1f}x: "
        f"{ratio / best:.3f} of it), losslessly; {tot_dedup / lossy_b:.2f}x the bytes of dedup+fp16, the "
        f"{REFERENCE_DEFAULT_NAME} ({tot_none / lossy_b:.1f}x fewer than none fp32)",
        f"with the id all-to-all ({ids / 2**20:.3f} MiB/step, int64 ids + lengths), at the reference's dim "
        f"{REFERENCE_DIM}: none / dedup = {(tot_none * row_full + ids) / (tot_dedup * row_full + ids):.1f}x, "
        f"dedup / dedup+fp16 = {(tot_dedup * row_full + ids) / (lossy_b * row_full + ids):.2f}x (the reference's "
        f"index dedup also sends only distinct ids: {tot_distinct * 8 / 2**20:.3f} MiB of ids here)",
        "step time (fwd+bwd, loopback, slowest rank; orientation only): "
        + ", ".join(f"{c} {result[c]['step_s'] * 1e3:.1f} ms" for c in CODECS)
        + f"; dedup / none {result['dedup']['step_s'] / result['none']['step_s']:.2f}; dedup's own work "
        f"{dedup['codec_seconds_per_step'] * 1e3:.1f} ms/step, in its all-to-alls "
        f"{dedup['transfer_seconds_per_step'] * 1e3:.1f} ms/step (slowest rank)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="samples per rank")
    ap.add_argument("--seq-len", type=int, default=2048, help="longest history (lengths drawn in [L/2, L])")
    ap.add_argument("--dim", type=int, default=16, help="embedding dim (payload ratios do not depend on it)")
    ap.add_argument("--row-cap", type=int, default=100_000, help="rows per table (the full tables need ~600 GB)")
    ap.add_argument("--sharding", choices=("row_wise", "table_wise"), default="row_wise")
    ap.add_argument("--context-unique", type=float, default=1.0,
                    help="distinct fraction of uid and the hashed crosses (one id per sample; 1.0 = all distinct)")
    ap.add_argument("--zipf", type=float, default=1.1, help="skew of the repeats among a table's distinct ids")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    print(report(args, measure(args)))


if __name__ == "__main__":
    main()
