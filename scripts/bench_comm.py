"""Embedding all-to-all bytes and time per codec, on real Criteo rows or synthetic ids.

    PYTHONPATH=. python scripts/bench_comm.py --data criteo_kaggle_sample.tsv.gz \
        --world-size 8 --batch-size 4096 --codec none dedup fp16 bf16 int8 dedup+fp16 dedup+bf16
    PYTHONPATH=. python scripts/bench_comm.py --data synthetic-terabyte --multi-hot \
        --world-size 8 --batch-size 4096 --codec none dedup --measure-ranks 0

`--data synthetic` draws ids from the calibrated `kaggle` profile,
`synthetic-terabyte` from the `terabyte` profile (MLPerf table sizes: v1's, or
DCNv2's with `--multi-hot`). `--multi-hot` gives every table MLPerf DCNv2's bag
size; as in MLPerf's multi-hot data each bag is a fixed function of its one-hot
id, so the distinct bags are the distinct ids (dedup's payload is unchanged)
while the id all-to-all carries every id of every bag.

Two levels (`comm.hierarchy: node`): `--ranks-per-node L` groups the ranks
into nodes of L; the byte part then also prints the payload between nodes of
`none`, one-level `dedup` and the ideal of node-level dedup (the distinct rows
of each (table, destination node), counted from the ids) with messages per
step, and `--codec dedup/node` times the two-level codec itself, whose counted
bytes between nodes are printed against that ideal:

    PYTHONPATH=. python scripts/bench_comm.py --data synthetic --world-size 4 --ranks-per-node 2 \
        --batch-size 2048 --dim 128 --codec none dedup dedup/node --measure-ranks 4

LOSSY codecs (TorchRec qcomms fp16/bf16/int8, stacked dedup+fp16/bf16) are
marked as such; for them the timing run also reports the forward error against
`none` (max and mean |difference| of the pooled output, same weights and batch).

Two parts, printed side by side per codec:
- bytes per step for `--world-size` ranks (any size: the global batches are
  split as that many ranks would see them; tables placed table-wise round
  robin). Counted from the ids: embedding payload forward + backward, the id
  all-to-all, their ratios to `none`, and the ideal B/U. Only blocks that
  leave their rank count (a rank's block to itself is a local copy).
- time, measured on real Gloo ranks (at most `--measure-ranks`, default 2,
  this machine's cores) running the real sharded EBC with each codec in one
  run: whole step, all-to-all transfer, and codec work (unique, expand,
  segment-sum) separately; then the all-to-all phase projected for 25/100/400
  Gb/s links from the bytes. On CPU loopback the "network" is a memcpy, so
  measured transfer understates what a real link saves (docs/design.md §6).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp
from tqdm import tqdm

from dlrmtrain.data.formats.criteo_text import iter_parsed
from dlrmtrain.data.synthetic.generator import power_law_ids
from dlrmtrain.data.synthetic.profiles import profile_tables
from dlrmtrain.features import CAT_KEYS, MLPERF_DCNV2_MULTI_HOT_SIZES, NUM_SPARSE, TABLE_NAMES

NUM_CAT = NUM_SPARSE
LINK_GBPS = (25, 100, 400)


# ----------------------------------------------------------------------------- data
def read_criteo_tsv(path: Path, max_rows: int | None) -> np.ndarray:
    """Categorical columns of a raw Criteo day file as contiguous per-column ids [N, 26].

    Parsed by the project's own vectorised parser (bad lines stop with file:line);
    each column's values are then numbered 0..n-1 (distinct counts per batch, all
    the byte figures depend on, do not depend on the numbering).
    """
    chunks, rows = [], 0
    for parsed in tqdm(iter_parsed(path), desc=f"reading {path.name}", unit=" chunks", leave=False):
        chunks.append(parsed.cats)
        rows += len(parsed)
        if max_rows and rows >= max_rows:
            break
    cats = np.concatenate(chunks)[:max_rows]
    return np.stack([np.unique(col, return_inverse=True)[1] for col in cats.T],
                    axis=1).astype(np.int64)


def synthetic_ids(num_rows: int, profile: str = "kaggle", tables: str = "v1",
                  seed: int = 0) -> np.ndarray:
    """Ids of a calibrated synthetic profile: `kaggle` (each column's distinct fraction
    at batch 4096 matches the real Kaggle sample) or `terabyte` (MLPerf table sizes)."""
    rng = np.random.default_rng(seed)
    sizes, exponents = profile_tables(profile, tables)
    return np.stack([power_law_ids(rng, n, s, num_rows) for n, s in zip(sizes, exponents)], axis=1)


def global_batches(ids: np.ndarray, world_size: int, batch_size: int) -> list[np.ndarray]:
    step = world_size * batch_size
    n = len(ids) // step
    if n == 0:
        raise SystemExit(f"{len(ids)} rows are fewer than one global batch of {world_size}x{batch_size}")
    return [ids[i * step:(i + 1) * step] for i in range(n)]


# ---------------------------------------------------------------------------- bytes
def byte_figures(batches: list[np.ndarray], world_size: int, batch_size: int, dim: int,
                 bag_sizes: list[int] | None = None) -> dict:
    """Off-rank bytes per step for none and dedup (fp32 payload, int64 ids, int32 lengths).
    `bag_sizes`: ids per bag per table (multi-hot; each bag a function of its id)."""
    bag_sizes = bag_sizes or [1] * NUM_CAT
    owner = [t % world_size for t in range(NUM_CAT)]
    rows_all = rows_unique = 0
    payload_none = payload_dedup = ids_bytes = 0
    per_rank_none = np.zeros(world_size)
    per_rank_dedup = np.zeros(world_size)
    table_unique = np.zeros(NUM_CAT)
    for gb in tqdm(batches, desc="counting bytes", leave=False):
        for s in range(world_size):
            block = gb[s * batch_size:(s + 1) * batch_size]
            for t in range(NUM_CAT):
                u = len(np.unique(block[:, t]))
                table_unique[t] += u
                rows_all += batch_size
                rows_unique += u
                if owner[t] == s:
                    continue  # the owner's block to itself never leaves the rank
                payload_none += 2 * batch_size * dim * 4  # forward rows + backward grads
                payload_dedup += 2 * u * dim * 4
                ids_bytes += batch_size * (8 * bag_sizes[t] + 4)  # a bag's ids + its length
                # the owner sends forward, the sample rank sends backward: both directions
                per_rank_none[owner[t]] += batch_size * dim * 4
                per_rank_none[s] += batch_size * dim * 4
                per_rank_dedup[owner[t]] += u * dim * 4
                per_rank_dedup[s] += u * dim * 4
    steps = len(batches)
    return {
        "steps": steps,
        "distinct_fraction": rows_unique / rows_all,
        "ideal_ratio": rows_all / rows_unique,
        "table_distinct_fraction": (table_unique / (steps * world_size * batch_size)).tolist(),
        "none": {"payload": payload_none / steps, "ids": ids_bytes / steps,
                 "max_rank_send": per_rank_none.max() / steps},
        "dedup": {"payload": payload_dedup / steps, "ids": ids_bytes / steps,
                  "max_rank_send": per_rank_dedup.max() / steps},
    }


def node_figures(batches: list[np.ndarray], world_size: int, ranks_per_node: int, batch_size: int,
                 dim: int) -> dict:
    """Payload between nodes per step (fp32, forward + backward) from the ids, table-wise round robin:
    `none` (every bag), one-level `dedup` (distinct bags per (table, sample rank)) and the ideal of
    node-level dedup (distinct bags per (table, destination node)); messages per step."""
    L = ranks_per_node
    nodes = world_size // L
    owner = [t % world_size for t in range(NUM_CAT)]
    none = flat = ideal = 0
    for gb in batches:
        for n in range(nodes):
            node_block = gb[n * L * batch_size:(n + 1) * L * batch_size]
            for t in range(NUM_CAT):
                if owner[t] // L == n:
                    continue  # stays inside the owner's node
                none += 2 * len(node_block) * dim * 4
                ideal += 2 * len(np.unique(node_block[:, t])) * dim * 4
                for k in range(L):
                    flat += 2 * len(np.unique(node_block[k * batch_size:(k + 1) * batch_size, t])) * dim * 4
    steps = len(batches)
    W = world_size
    return {"none": none / steps, "dedup": flat / steps, "node_ideal": ideal / steps,
            # every rank sends to every other rank forward and back; two levels: its rail peers between nodes
            "messages_none": 2 * W * (W - 1), "messages_none_between": 2 * W * (W - L),
            "messages_node_between": 2 * W * (nodes - 1)}


# ---------------------------------------------------------------------------- timing
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kjt(block: np.ndarray, vocab: list[int], bag_sizes: list[int] | None):
    """One-hot bags, or multi-hot ones whose extra ids are a fixed hash of the first
    (as MLPerf's lookup table: equal ids give equal bags)."""
    from torchrec import KeyedJaggedTensor
    if bag_sizes is None:
        values = torch.from_numpy(np.ascontiguousarray(block.T).reshape(-1))
        lengths = torch.ones(values.numel(), dtype=torch.int32)
    else:
        parts = []
        for t in range(NUM_CAT):
            ids = block[:, t:t + 1]
            extra = (ids * (2 * np.arange(1, bag_sizes[t]) + 1) + 7919) % vocab[t]
            parts.append(np.concatenate([ids, extra], axis=1).reshape(-1))
        values = torch.from_numpy(np.concatenate(parts))
        lengths = torch.from_numpy(np.repeat(np.asarray(bag_sizes, dtype=np.int32), len(block)))
    return KeyedJaggedTensor(keys=CAT_KEYS, values=values, lengths=lengths)


def _time_rank(rank: int, world: int, port: int, batches: list[np.ndarray], vocab: list[int],
               codecs: list[str], dim: int, warmup: int, steps: int, bag_sizes, queue,
               ranks_per_node: int | None = None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    from dlrmtrain.comm.labels import parse_contender
    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.comm.registry import is_qcomms
    from dlrmtrain.comm.stats import collect_comm_stats
    from dlrmtrain.config.schema import CommConfig, ShardingConfig
    from dlrmtrain.distributed.env import shutdown_distributed
    from dlrmtrain.distributed.sharding import shard_model

    dist.init_process_group("gloo", rank=rank, world_size=world)
    B, out = batches[0].shape[0] // world, {}
    reference = None  # none's pooled output of the first timed batch: the lossy codecs' error baseline
    # table t on rank t % world, through the package's own planner and DMP builder
    sharding = ShardingConfig(planner="manual", default_type="table_wise",
                              table_ranks={TABLE_NAMES[t]: t % world for t in range(NUM_CAT)})
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.01}
    for codec in codecs:
        name, kind = parse_contender(codec)  # dedup/node: comm.hierarchy node
        comm = CommConfig(codec=name, hierarchy=kind, ranks_per_node=ranks_per_node or world, dedup_at="owner")
        torch.manual_seed(1234)  # TorchRec's table init draws from it: equal weights for every codec
        ebc = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name=TABLE_NAMES[t], embedding_dim=dim, num_embeddings=vocab[t],
                               feature_names=[CAT_KEYS[t]]) for t in range(NUM_CAT)], device=torch.device("meta"))
        model, _, counters = shard_model(ebc, sharding, Placement(comm, "pooled"), fused, torch.device("cpu"), world,
                                         ebc_path="")
        # stock transfer time: the same split sizes TorchRec's all-to-all uses
        dims = [dim * len(range(r, NUM_CAT, world)) for r in range(world)]
        a2a_in, a2a_out = torch.randn(B * world * dims[rank]), torch.empty(B * sum(dims))
        step_s = a2a_s = 0.0
        # a fixed random upstream gradient: contiguous, like a real top MLP's
        upstream = torch.randn(B, NUM_CAT * dim, generator=torch.Generator().manual_seed(rank))
        for i in range(warmup + steps):
            kjt = _kjt(batches[i % len(batches)][rank * B:(rank + 1) * B], vocab, bag_sizes)
            dist.barrier()
            t0 = time.perf_counter()
            kt = model(kjt)
            (kt.values() * upstream).sum().backward()
            t1 = time.perf_counter()
            if i == 0:  # before any update: same weights in every codec's model
                error = _forward_error(kt.values().detach(), reference)
                if codec == "none":
                    reference = kt.values().detach().clone()
            if codec == "none":
                for _ in range(2):  # forward and backward all-to-all
                    dist.all_to_all_single(a2a_out, a2a_in, [B * d for d in dims], [B * dims[rank]] * world)
            t2 = time.perf_counter()
            if i == warmup - 1 and codec != "none":
                warm = collect_comm_stats(counters)
            if i >= warmup:
                step_s += t1 - t0
                a2a_s += t2 - t1
        stats = collect_comm_stats(counters)
        if codec == "none":
            out[codec] = {"step": step_s / steps, "transfer": a2a_s / steps, "codec": 0.0, **error}
        else:
            n = stats["steps"] - warm["steps"]
            out[codec] = {"step": step_s / steps,
                          "transfer": (stats["transfer_seconds_per_step"] * stats["steps"]
                                       - warm["transfer_seconds_per_step"] * warm["steps"]) / n,
                          "codec": (stats["codec_seconds_per_step"] * stats["steps"]
                                    - warm["codec_seconds_per_step"] * warm["steps"]) / n,
                          "recv_bytes": stats["total"]["payload_fwd_recv_bytes"],
                          "recv_bytes_none": stats["total"]["uncompressed_fwd_recv_bytes"],
                          # whole run (warm-up included): the batches the ideal is counted over
                          "inter_node_bytes": stats["inter_node_bytes_per_step"],
                          "messages": stats["messages_per_step"],
                          "inter_node_messages": stats["inter_node_messages_per_step"], **error}
        if is_qcomms(codec):  # quantize + transfer happen inside TorchRec's all-to-all: not split out
            out[codec]["transfer"] = out[codec]["codec"] = float("nan")
        del model, kt
    queue.put((rank, out))
    shutdown_distributed()


def _forward_error(out: torch.Tensor, reference: torch.Tensor | None) -> dict:
    """max / mean |out - reference| and mean |reference| (NaN without a `none` run first)."""
    if reference is None:
        return {"err_max": float("nan"), "err_mean": float("nan"), "ref_mean": float("nan")}
    diff = (out.double() - reference.double()).abs()
    return {"err_max": diff.max().item(), "err_mean": diff.mean().item(),
            "ref_mean": reference.double().abs().mean().item()}


def measure(batches, vocab, codecs, dim, world, warmup, steps, bag_sizes=None, ranks_per_node=None) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_time_rank, args=(r, world, port, batches, vocab, codecs, dim, warmup, steps, bag_sizes,
                                                queue, ranks_per_node))
             for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise SystemExit(f"timing rank exited with {p.exitcode}")
    # the slowest rank sets the pace of a collective step; bytes add up over ranks
    return {c: {k: (sum if k.endswith("bytes") or k.endswith("none") or k.endswith("messages") else
                    (lambda v: sum(v) / len(v)) if k in ("err_mean", "ref_mean") else max)(
                        [results[r][c][k] for r in results])
                for k in results[0][c]} for c in codecs}


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True,
                    help="raw Criteo TSV (.gz ok), 'synthetic' (kaggle profile) or 'synthetic-terabyte'")
    ap.add_argument("--multi-hot", action="store_true",
                    help="MLPerf DCNv2 bag sizes (and, with synthetic-terabyte, its table sizes)")
    ap.add_argument("--world-size", type=int, required=True, help="ranks the byte figures are for")
    ap.add_argument("--batch-size", type=int, required=True, help="local (per-rank) batch size")
    ap.add_argument("--codec", nargs="+", required=True, help="codecs to compare, e.g. none dedup")
    ap.add_argument("--dim", type=int, default=128, help="embedding dimension (MLPerf: 128)")
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--measure-ranks", type=int, default=2, help="Gloo ranks for the timing (0: skip)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--max-table-rows", type=int, default=None,
                    help="timing only: tables capped at this many rows (ids folded mod cap); "
                         "needed for MLPerf table sizes, which do not fit in memory here")
    ap.add_argument("--json", default=None, help="write the byte figures (per table too) here")
    ap.add_argument("--ranks-per-node", type=int, default=None,
                    help="ranks per node: payload between nodes and messages per step, and what "
                         "--codec dedup/node (two levels) is measured against")
    return ap.parse_args(argv)


def checked_contenders(args: argparse.Namespace) -> dict[str, tuple[str, str]]:
    """`--codec` as {contender: (codec, flat|node)}, each one this run can time on CPU ranks;
    `none` moved first (the lossy codecs' error baseline)."""
    from dlrmtrain.comm.labels import CODEC_NAMES, parse_contender
    from dlrmtrain.comm.codec_choice import validate_codec_choice
    try:
        contenders = {c: parse_contender(c) for c in args.codec}
    except ValueError as e:
        raise SystemExit(f"--codec: {e}") from None
    node_codecs = [c for c, (_, kind) in contenders.items() if kind == "node"]
    if node_codecs and (not args.ranks_per_node or node_codecs != ["dedup/node"]):
        raise SystemExit("--codec dedup/node (the only two-level codec) needs --ranks-per-node")
    if args.ranks_per_node and (args.world_size % args.ranks_per_node
                                or args.world_size // args.ranks_per_node < 2):
        raise SystemExit(f"--ranks-per-node {args.ranks_per_node}: --world-size {args.world_size} "
                         f"must be at least two whole nodes")
    unknown = [c for c, (name, _) in contenders.items() if name not in CODEC_NAMES]
    if unknown:
        raise SystemExit(f"--codec: unknown {unknown}; available: {sorted(CODEC_NAMES)}")
    for c, (name, _) in contenders.items():
        try:
            validate_codec_choice(name, {}, "cpu")  # the timing runs on CPU ranks
        except ValueError as e:
            raise SystemExit(f"--codec {c}: {e}") from None
    if "none" in args.codec:  # none first: it is the error baseline of the lossy codecs
        args.codec = ["none"] + [c for c in args.codec if c != "none"]
    return contenders


def load_ids(args: argparse.Namespace) -> tuple[np.ndarray, str]:
    """The id rows of `--data`, and what they are."""
    if args.data in ("synthetic", "synthetic-terabyte"):
        profile = "kaggle" if args.data == "synthetic" else "terabyte"
        tables = "dcnv2" if args.multi_hot else "v1"
        ids = synthetic_ids(max(args.max_rows or 0, 4 * args.world_size * args.batch_size),
                            profile, tables)
        return ids, f"synthetic ids, calibrated `{profile}` profile" + (
            f" ({tables} table sizes)" if profile == "terabyte" else "")
    ids = read_criteo_tsv(Path(args.data), args.max_rows)
    return ids, f"{args.data} ({len(ids)} rows)"


class Labels:
    """How the tables name each contender (`(LOSSY)` where it is) and its wire bytes per value."""

    def __init__(self, args: argparse.Namespace, contenders: dict[str, tuple[str, str]]) -> None:
        from dlrmtrain.comm.declarations import lossy_codecs
        from dlrmtrain.comm.registry import wire_bytes_per_value
        self.label = {c: f"{c} (LOSSY)" if c in lossy_codecs() else c for c in args.codec}
        self.width = max(len(v) for v in self.label.values()) + 1
        self.wire = {c: wire_bytes_per_value(name) for c, (name, _) in contenders.items()}
        self.flat = [c for c, (_, kind) in contenders.items() if kind == "flat"]  # dedup/node: "between nodes"


def print_bytes(args: argparse.Namespace, ids: np.ndarray, source: str, names: Labels) -> None:
    """The byte part: payload and ids per step of each flat contender against `none`, and the
    all-to-all phase they project to over LINK_GBPS links (`--json`: the figures)."""
    label, width, wire = names.label, names.width, names.wire
    bag_sizes = MLPERF_DCNV2_MULTI_HOT_SIZES if args.multi_hot else None
    figs = byte_figures(global_batches(ids, args.world_size, args.batch_size),
                        args.world_size, args.batch_size, args.dim, bag_sizes)
    bags = (f"multi-hot (DCNv2 bag sizes, {sum(MLPERF_DCNV2_MULTI_HOT_SIZES)} ids/sample)"
            if bag_sizes else "one-hot")
    print(f"\ndata: {source}; {NUM_CAT} {bags} tables, dim {args.dim}, fp32, table-wise round robin")
    print(f"bytes: world size {args.world_size}, local batch {args.batch_size}, "
          f"{figs['steps']} global batches; distinct fraction {figs['distinct_fraction']:.4f}, "
          f"ideal B/U {figs['ideal_ratio']:.3f}x")
    base = figs["none"]
    print(f"{'codec':<{width}} {'bytes/value':>11} {'payload MB/step':>16} {'ratio':>7} {'/ideal':>7} "
          f"{'+ids MB/step':>13} {'ratio':>7}")

    def scaled(c: str) -> dict:
        """Byte figures of codec c: dedup's or none's rows, at c's wire bytes per value."""
        f = figs["dedup" if c.startswith("dedup") else "none"]
        k = wire[c] / 4.0
        return {"payload": f["payload"] * k, "ids": f["ids"], "max_rank_send": f["max_rank_send"] * k}

    for c in names.flat:
        f = scaled(c)
        ratio = base["payload"] / f["payload"]
        whole = (base["payload"] + base["ids"]) / (f["payload"] + f["ids"])
        vs_ideal = f"{ratio / figs['ideal_ratio']:.3f}" if c.startswith("dedup") else "-"
        print(f"{label[c]:<{width}} {wire[c]:>11.3g} {f['payload'] / 1e6:>16.2f} {ratio:>6.3f}x {vs_ideal:>7} "
              f"{(f['payload'] + f['ids']) / 1e6:>13.2f} {whole:>6.3f}x")
    if args.json:
        import json
        Path(args.json).write_text(json.dumps({
            "data": source, "world_size": args.world_size, "batch_size": args.batch_size,
            "dim": args.dim, "bag_sizes": bag_sizes or [1] * NUM_CAT, **figs}, indent=2) + "\n")
    print("projected all-to-all phase per step (busiest rank's payload + ids over its link):")
    for c in names.flat:
        f = scaled(c)
        ids_per_rank = f["ids"] / args.world_size
        cells = "  ".join(f"{g} Gb/s {(f['max_rank_send'] + ids_per_rank) * 8 / (g * 1e9) * 1e3:7.2f} ms"
                          for g in LINK_GBPS)
        print(f"  {label[c]:<{width}} {cells}")


def print_between_nodes(args: argparse.Namespace, ids: np.ndarray) -> None:
    """`--ranks-per-node`: none's, one-level dedup's and the node-level ideal's payload between
    nodes, and the messages per step, counted from the ids."""
    L = args.ranks_per_node
    nf = node_figures(global_batches(ids, args.world_size, args.batch_size), args.world_size, L,
                      args.batch_size, args.dim)
    print(f"between nodes: {args.world_size // L} nodes x {L} ranks, payload forward + backward "
          f"(counted from the ids)")
    print(f"  {'none':<22} {nf['none'] / 1e6:10.2f} MB/step  1.000x   messages/step "
          f"{nf['messages_none']} ({nf['messages_none_between']} between nodes)")
    print(f"  {'dedup (one level)':<22} {nf['dedup'] / 1e6:10.2f} MB/step  {nf['none'] / nf['dedup']:.3f}x")
    print(f"  {'node-level ideal':<22} {nf['node_ideal'] / 1e6:10.2f} MB/step  "
          f"{nf['none'] / nf['node_ideal']:.3f}x   (vs one level {nf['dedup'] / nf['node_ideal']:.3f}x; "
          f"two levels: {nf['messages_node_between']} messages/step between nodes)")


def print_timings(args: argparse.Namespace, ids: np.ndarray, names: Labels, two_level: bool) -> None:
    """The time part: each codec on `--measure-ranks` real Gloo ranks (step, transfer, codec
    work, the lossy ones' forward error), and what the codecs counted between nodes."""
    label, width = names.label, names.width
    world = args.measure_ranks
    vocab = [int(ids[:, t].max()) + 1 for t in range(NUM_CAT)]
    if args.max_table_rows:
        ids = ids % args.max_table_rows
        vocab = [min(v, args.max_table_rows) for v in vocab]
    elif sum(vocab) * args.dim * 4 > 8e9:
        raise SystemExit(f"--measure-ranks: the tables take {sum(vocab) * args.dim * 4 / 1e9:.0f} GB; "
                         "cap them with --max-table-rows (e.g. 20000) or pass --measure-ranks 0")
    batches = global_batches(ids, world, args.batch_size)
    print(f"\ntiming: {world} Gloo ranks on this machine, local batch {args.batch_size}, "
          f"{args.steps} steps after {args.warmup} warm-up (forward + backward + fused SGD)")
    if two_level and world != args.world_size:
        raise SystemExit("--codec dedup/node: --measure-ranks must equal --world-size")
    t = measure(batches, vocab, args.codec, args.dim, world, args.warmup, args.steps,
                MLPERF_DCNV2_MULTI_HOT_SIZES if args.multi_hot else None, args.ranks_per_node)
    print(f"{'codec':<{width}} {'step ms':>9} {'transfer ms':>12} {'codec ms':>9} {'step vs none':>13} "
          f"{'max |err|':>10} {'mean |err|':>11} {'rel':>9}")
    for c in args.codec:
        r = t[c]
        rel = f"{t['none']['step'] / r['step']:.2f}x" if "none" in t else "-"
        err_rel = r["err_mean"] / r["ref_mean"] if r["ref_mean"] else float("nan")
        print(f"{label[c]:<{width}} {r['step'] * 1e3:>9.1f} {r['transfer'] * 1e3:>12.1f} "
              f"{r['codec'] * 1e3:>9.1f} {rel:>13} {r['err_max']:>10.3g} {r['err_mean']:>11.3g} {err_rel:>9.2g}")
    for c in args.codec:
        if "recv_bytes" in t[c]:
            print(f"{c}: bytes the codec itself counted on these ranks (all blocks, warm-up included): "
                  f"{t[c]['recv_bytes_none'] / t[c]['recv_bytes']:.3f}x fewer than none")
    if args.ranks_per_node:
        print_counted_between_nodes(args, t, [batches[i % len(batches)] for i in range(args.warmup + args.steps)])
    print("(none: transfer = the stock forward+backward all-to-all sizes timed alone; dedup: time "
          "waiting for its all_to_all_single; codec = unique, expand, segment-sum, indices; qcomms: "
          "quantization runs inside TorchRec's all-to-all, so it is not split out; err = forward "
          "pooled output vs none, same weights, first batch; rel = mean |err| / mean |none|)")


def print_counted_between_nodes(args: argparse.Namespace, t: dict, ran: list) -> None:
    """The bytes and messages between nodes each codec counted over the batches it `ran`,
    against none's and the node-level ideal's from the same ids."""
    nf = node_figures(ran, args.measure_ranks, args.ranks_per_node, args.batch_size, args.dim)
    print(f"between nodes, counted by the codecs over the {len(ran)} batches they ran "
          f"(ideal and none from the same ids):")
    for c in args.codec:
        if "inter_node_bytes" not in t[c]:
            continue
        got = t[c]["inter_node_bytes"]
        ratio = nf["none"] / got if got else float("inf")
        print(f"  {c:<12} {got / 1e6:10.2f} MB/step  ratio to none {ratio:.3f}x  "
              f"/ node-level ideal {ratio / (nf['none'] / nf['node_ideal']):.3f}  messages/step "
              f"{t[c]['messages']:.0f} ({t[c]['inter_node_messages']:.0f} between nodes; none "
              f"{nf['messages_none']} ({nf['messages_none_between']}))")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    contenders = checked_contenders(args)
    names = Labels(args, contenders)
    ids, source = load_ids(args)
    print_bytes(args, ids, source, names)
    if args.ranks_per_node:
        print_between_nodes(args, ids)
    if args.measure_ranks:
        print_timings(args, ids, names, two_level=any(kind == "node" for _, kind in contenders.values()))


if __name__ == "__main__":
    sys.exit(main())
