"""Training-step speed of dlrmtrain against a plain TorchRec DMP loop.

The plain loop has the shape of TorchRec's golden training example
(examples/golden_training/train_dlrm.py): DLRM on the meta device, sharder
with a fused optimizer, DistributedModelParallel, dense optimizer combined
with the fused one, forward / backward / step. Both run the same model, the
same sharding plan (so the same bytes move), the same global batch and the
same pre-built batches (data loading is not timed) on the same ranks, in
alternating blocks (ABC, CBA, ...) so machine noise hits all alike. Prints the
median per-step times and their ratios (goal: dlrmtrain / plain ≤ 1.02).

    python scripts/bench_train.py [--shape quickstart|mlperf|dcnv2] [--world-size 2]
        [--steps 30] [--rounds 3] [--vs "KEY=VALUE ..."]... [--no-plain] [--torchrec-order] [--json PATH]
        [--link-gbit G [--link-latency-ms L]] [--sim-nodes N] [overrides...]

`--link-gbit G` runs it behind a shaped loopback (dlrmtrain.testbed.shaped_link,
one link shared by all ranks; it then also prints what the bytes each contender saves are
worth: the first contender's step less their wire time at G); with `--sim-nodes N` the world size is split into N
simulated nodes (dlrmtrain.testbed.sim_nodes) and G is each node's link to
the others, so only traffic between nodes is shaped.

Shapes (`--shape`, default quickstart; `--config` + overrides for anything else):
  quickstart  configs/quickstart.yaml (dim 16, global batch 2048)
  mlperf      configs/mini_mlperf_dim128.yaml: MLPerf's embedding shape (dim 128, MLPerf v1
              MLP widths, global batch 8192 on 2 ranks, synthetic `kaggle` profile)
  dcnv2       configs/mlperf_dcnv2.yaml scaled to a CPU (tables capped at 20000 rows,
              global batch 4096): multi-hot bags, DCN interaction, Adagrad
  dlrmv4      configs/mini_dlrmv4.yaml: HSTU on synthetic Yambda-like users, sequence
              embeddings (TorchRec has no plain HSTU model: no plain contender)
  dlrmv4_long mini_dlrmv4 at long, unevenly filled sequences: N up to 2,048 rows, each
              sample 1,028..2,048 rows (uniform: Yambda's histories fill their slots
              unevenly), 4 samples per rank; the attention kernel dominates its step. Its
              kernels side by side: `--shape dlrmv4_long --vs model.hstu.attention=blocked
              model.hstu.attention=padded` (padded first: the ratio is blocked / padded)
Overrides are dlrmtrain config overrides on top of the shape's config.
Each `--vs "KEY=VALUE ..."` adds a contender: dlrmtrain again with those extra
overrides, e.g. `--vs comm.codec=dedup` or `--vs precision.mode=bf16`; with
`--vs run.pipeline=fused_sparse_dist` its blocks run through that pipeline (which
fills at each block's start and drains at its end). The plain
TorchRec contender (TorchRec's `DLRM` for `dlrm_v1`, `DLRM_DCN` for `dlrm_dcnv2`)
runs too unless `--no-plain`. Ratios are printed against the first contender
(dlrmtrain with the shape's config) and against plain TorchRec; `--json` writes them.

It also prints, on rank 0, each codec's own time on the step's critical path
(its kernels, plan and launches: the comm stats' codec time over the timed
blocks) next to the first contender's all-to-all time (Gloo's all_to_all
durations under the torch profiler, one extra block: the pooled embeddings'
all-to-alls and TorchRec's small id all-to-all alike): the issue's
goal is codec time ≤ 20% of `none`'s all-to-all time at MLPerf's shape.
And, per contender, how much of that all-to-all wall time was hidden behind
compute (an operator running on another thread meanwhile; one profiled block).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import deque
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]

# Benchmark shapes: (config, overrides). bench_link.py sweeps the same ones.
SHAPES = {
    "quickstart": ("configs/quickstart.yaml", []),
    "mlperf": ("configs/mini_mlperf_dim128.yaml", []),
    "dcnv2": ("configs/mlperf_dcnv2.yaml",
              ["run.device=cpu", "model.max_table_rows=20000", "run.global_batch_size=4096",
               "data.synthetic.num_train_samples=262144", "mlperf.enabled=false"]),
    "dlrmv4": ("configs/mini_dlrmv4.yaml", []),
    "dlrmv4_long": ("configs/mini_dlrmv4.yaml", [
        # 1,028..2,048 rows (8 contextual + 1,019..2,039 history events + 1 candidate), each
        # sample its own user (one anchor each: a user's anchors share its history length)
        "data.yambda.max_seq_len=2048", "model.hstu.max_seq_len=2048",
        "data.yambda.synthetic.history_length=2039", "data.yambda.synthetic.min_history_fraction=0.5",
        "data.yambda.synthetic.num_users=512", "data.yambda.synthetic.anchors_per_user=1",
        "data.yambda.synthetic.eval_anchors_per_user=1", "run.global_batch_size=8"]),
}
# Archs with a plain TorchRec model to race against (bench_train's `plain` contender).
PLAIN_ARCHS = ("dlrm_v1", "dlrm_dcnv2")


def parse_args(argv: list[str]) -> argparse.Namespace:
    from dlrmtrain.testbed.options import add_link_options

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=30, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=3, help="alternating blocks per contender")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="untimed steps per contender first (default: --steps); comm.codec=auto "
                        "decides within 6-14 steps")
    p.add_argument("--shape", choices=sorted(SHAPES), default="quickstart")
    p.add_argument("--config", default=None, help="instead of the shape's config")
    p.add_argument("--vs", action="append", default=[], metavar="OVERRIDES",
                   help="add a dlrmtrain contender with these extra overrides (space-separated)")
    p.add_argument("--no-plain", action="store_true", help="leave out plain TorchRec")
    p.add_argument("--torchrec-order", action="store_true",
                   help="add dlrmtrain with the shape's config in torchrec's forward order (bottom MLP, "
                        "then the embedding all-to-all, waited at once) beside sparse first")
    p.add_argument("--json", default=None, help="write the medians and ratios here (rank 0)")
    add_link_options(p, "splitting --world-size")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    seen = set()
    for vs in args.vs:  # contenders are keyed by their overrides: a repeat would silently be one
        key = " ".join(vs.split())
        if key in seen:
            p.error(f"--vs {vs!r} is given twice (each contender once)")
        seen.add(key)
    return args


def print_reference_wire(arch: str, names: list[str]) -> None:
    """Names the contender that is the benchmark's reference's own wire, if one runs."""
    from dlrmtrain.mlperf.benchmarks import display_label
    from dlrmtrain.workloads import workload_named
    for name in names:
        codec = name.removeprefix("dlrmtrain comm.codec=")
        label = display_label(workload_named(arch).benchmark, codec)
        if label != codec:
            print(f"  ({name}: {label.split(': ', 1)[1]})")


def with_distinct_bags(stepper, trainer, batches: list, kind: str):
    """`stepper` fed each batch's distinct bags (comm.dedup_at: source; `kind` sequence: each
    table's distinct ids), or under `auto` both forms, each step taking the one its `SourceAuto`
    picks as the trainer's batches do: in a run the loader's prefetch thread makes them; here
    all are made before any timing (from the shared full batches, which a loader of their own
    makes), so the figure leaves out that thread's CPU time."""
    import dataclasses

    from dlrmtrain.comm.auto.source import BOTH_FORMS

    transform = trainer.placement.batch_transform(trainer.model)  # what the loader's thread would run
    full, distinct = BOTH_FORMS[1 if kind == "sequence" else 0]
    auto = trainer.source_auto  # comm.codec auto: both forms kept, each step picks one as it is taken
    made = {id(b): dataclasses.replace(b, **{distinct if auto else full: transform(getattr(b, full))})
            for b in batches}
    if auto is not None:
        return lambda block: stepper(auto.pick(made[id(b)]) for b in block)
    return lambda block: stepper([made[id(b)] for b in block])


def shape_config(args: argparse.Namespace) -> tuple[str, list[str]]:
    config, overrides = SHAPES[args.shape]
    if args.config:
        return args.config, list(args.overrides)
    return str(REPO / config), [*overrides, *args.overrides]


LINK_GBIT_ENV = "BENCH_TRAIN_LINK_GBIT"
"""the shaped link's rate on the ranks (one link shared by all ranks; unset on simulated nodes)"""


def print_wire_worth(names: list[str], median: dict, link_bytes: dict) -> dict[str, float]:
    """Per contender, the step time of the first one less the wire time of the bytes the
    contender does not send at the link's rate (every byte through the one shaped link,
    both directions, pays rate): what the saved bytes alone are worth, as a ratio of the
    first contender's step. A codec beats it only by also saving work off the wire (an
    unshaped run's ratio shows that part). {} without a single shaped link."""
    gbit = os.environ.get(LINK_GBIT_ENV)
    if gbit is None or not all(link_bytes.values()):
        return {}
    base = names[0]
    sent = {n: statistics.median(b) for n, b in link_bytes.items()}
    worth = {n: 1 - (sent[base] - sent[n]) * 8 / (float(gbit) * 1e9) / median[base]
             for n in names[1:] if n in sent}
    print(f"  wire time the saved bytes are worth at {gbit} Gbit/s ({base}'s step less "
          "(its bytes − a contender's) × 8 / rate):")
    width = max(len(n) for n in worth) + 2 if worth else 0
    for n, ratio in worth.items():
        print(f"    {n:<{width}}{ratio:.3f} of ({base})'s time")
    return worth


def link_bytes_sent() -> int | None:
    """Bytes sent through the link so far: `lo` inside shaped_link's private namespace
    (exactly the ranks' traffic), or this node's link to the other nodes
    (sim_nodes names it in $DLRMTRAIN_LINK_DEVICE); None where unreadable."""
    device = os.environ.get("DLRMTRAIN_LINK_DEVICE", "lo")
    # /proc/net/dev is per network namespace (/sys/class/net shows the host's).
    try:
        for line in Path("/proc/net/dev").read_text().splitlines():
            name, _, fields = line.partition(":")
            if name.strip() == device:
                return int(fields.split()[8])  # transmit bytes
    except (OSError, ValueError, IndexError):
        pass
    return None


def between_nodes(sent: float) -> float:
    """On simulated nodes each node counts its own link: the sum over nodes (one rank
    of each adds its node's count); elsewhere `sent` as is."""
    if "DLRMTRAIN_LINK_DEVICE" not in os.environ:
        return sent
    import torch
    import torch.distributed as dist

    total = torch.tensor([sent if os.environ.get("LOCAL_RANK") == "0" else 0.0],
                         dtype=torch.float64)
    dist.all_reduce(total)
    return float(total)


def codec_seconds_so_far(trainer) -> float:
    """This rank's codec time so far (all of the model's codec all-to-alls)."""
    from dlrmtrain.comm.stats import collect_comm_stats
    stats = collect_comm_stats(trainer.comm_counters)
    return stats["codec_seconds_per_step"] * stats["steps"]


EMBEDDING_COLLECTIVES = ("all_to_all (embeddings)", "reduce_scatter (row-wise emb)")


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _covered(interval: tuple[float, float], merged: list[tuple[float, float]]) -> float:
    a, b = interval
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in merged)


def all_to_all_profile(step, block) -> tuple[float, float]:
    """Per step, the wall time of Gloo's embedding collectives of `step(block)` on this rank (torch
    profiler: the pooled embeddings' all-to-alls, row-wise reduce-scatters and TorchRec's
    small id all-to-all), and the fraction of it hidden behind compute: the part during which
    an operator (a leaf profiler event) ran on a thread other than Gloo's. Python between
    operators counts as not hidden, so the fraction is a lower bound; rough on a loaded machine."""
    import torch.distributed as dist
    from torch.profiler import profile

    from dlrmtrain.metrics.step_breakdown import collective_category
    dist.barrier()
    with profile() as prof:
        step(block)
    dist.barrier()
    events = list(prof.events())
    comm = [e for e in events if collective_category(e.name) in EMBEDDING_COLLECTIVES]
    comm_threads = {e.thread for e in events if e.name.startswith(("gloo:", "nccl:"))}
    busy = _merged([(e.time_range.start, e.time_range.end) for e in events
                    if e.thread not in comm_threads and not e.cpu_children])
    total = sum(e.time_range.end - e.time_range.start for e in comm)
    hidden = sum(_covered((e.time_range.start, e.time_range.end), busy) for e in comm)
    return total / 1e6 / len(block), (hidden / total if total else 0.0)


def relaunch_under_torchrun(args: argparse.Namespace) -> None:
    """Become torchrun with this script on every rank (dlrmtrain.relaunch, as `dlrmtrain
    train` does): behind a shaped link, on simulated nodes, or on this machine's own loopback."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(REPO))
    from dlrmtrain.testbed.options import check_rate_options, without_link_options
    from dlrmtrain.launch import LaunchSpec
    from dlrmtrain.relaunch import relaunch
    from dlrmtrain.testbed.shaped_link import LinkSpec, ShapedLinkUnavailable
    from dlrmtrain.testbed.sim_nodes import SimNodes

    try:
        check_rate_options(args.link_gbit, args.link_latency_ms, "link-")
        link = None if args.link_gbit is None else LinkSpec(args.link_gbit, args.link_latency_ms)
        nodes = 1
        if args.sim_nodes is not None:  # --world-size ranks as nodes of equal size
            link = SimNodes(args.sim_nodes, link)
            nodes = link.nodes
            if args.world_size % nodes:
                raise ValueError(f"--world-size {args.world_size} does not split into "
                                 f"--sim-nodes {nodes} nodes of equal size")
            per_node = args.world_size // nodes
            print(f"bench_train: {link.describe()}, {per_node} rank{'s' if per_node > 1 else ''} "
                  f"each", flush=True)
        if args.link_gbit is not None and args.sim_nodes is None:  # one link: its rate prices bytes
            os.environ[LINK_GBIT_ENV] = str(args.link_gbit)
        spec = LaunchSpec(nproc=args.world_size // nodes, script=__file__, args=sys.argv[1:],
                          omp_threads=1)
        sys.exit(relaunch(spec, link, [sys.executable, __file__,
                                       *without_link_options(sys.argv[1:])]))
    except (ShapedLinkUnavailable, ValueError) as e:
        raise SystemExit(f"bench_train: {e}") from None


def plain_torchrec_model(cfg, rows, device):
    """TorchRec's own model for the config's `model.arch` (tables on the meta device):
    `DLRM` for dlrm_v1, `DLRM_DCN` for dlrm_dcnv2; any other arch is refused, so the
    plain contender never runs a different (cheaper) model than dlrmtrain."""
    import torch
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from dlrmtrain.features import CAT_KEYS, TABLE_NAMES

    tables = [EmbeddingBagConfig(name=table, embedding_dim=cfg.model.embedding_dim,
                                 num_embeddings=n, feature_names=[key])
              for table, key, n in zip(TABLE_NAMES, CAT_KEYS, rows, strict=True)]
    common = dict(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=cfg.data.num_dense_features,
        dense_arch_layer_sizes=cfg.model.bottom_mlp,
        over_arch_layer_sizes=cfg.model.top_mlp,
        dense_device=device)
    if cfg.model.arch == "dlrm_v1":
        return DLRMTrain(DLRM(**common))
    if cfg.model.arch == "dlrm_dcnv2":
        dlrm = DLRM_DCN(dcn_num_layers=cfg.model.dcn_num_layers,
                        dcn_low_rank_dim=cfg.model.dcn_low_rank_dim, **common)
        dlrm.inter_arch.to(device)
        return DLRMTrain(dlrm)
    raise SystemExit(f"bench_train: no plain TorchRec model for model.arch="
                     f"{cfg.model.arch!r}; run with --no-plain")


def build_plain_torchrec(cfg, rows, device, plan):
    """TorchRec's golden-example recipe, nothing of dlrmtrain's beyond the config values
    and the sharding plan (given, so both contenders move the same bytes)."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    model = plain_torchrec_model(cfg, rows, device)
    fused = {"learning_rate": cfg.optim.lr, "eps": cfg.optim.adagrad_eps,
             "optimizer": EmbOptimType.EXACT_ADAGRAD if cfg.optim.name == "adagrad"
             else EmbOptimType.EXACT_SGD}
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=[sharder])
    opt_cls = torch.optim.Adagrad if cfg.optim.name == "adagrad" else torch.optim.SGD
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda params: opt_cls(params, lr=cfg.optim.lr))
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


class Contenders:
    """What races, by name: the dlrmtrain ones (`trainers`: the shape's config first, then each
    `--vs` one and torchrec's order) and plain TorchRec (`plain`: its model and optimizer, or
    None); `steppers` runs a block of steps of each. (No dataclass: bench_floor.py loads this
    script without registering it as a module.)"""

    def __init__(self, env, config: str, shape_overrides: list[str], cfg) -> None:
        self.env, self.config, self.shape_overrides, self.cfg = env, config, shape_overrides, cfg
        self.trainers: dict = {}
        self.plain: Optional[tuple] = None
        self.steppers: dict = {}

    @property
    def trainer(self):
        """The first contender: dlrmtrain with the shape's config."""
        return next(iter(self.trainers.values()))

    def add(self, name: str, trainer) -> None:
        self.trainers[name] = trainer
        self.steppers[name] = blocks_of(trainer)


class Timings:
    """Per contender: each timed block's seconds per step, the bytes through the link per
    step, the codec's seconds over the timed blocks, and its profiled all-to-all (seconds per
    step, fraction hidden)."""

    def __init__(self, names: list[str], trainers: dict) -> None:
        self.blocks: dict = {n: [] for n in names}
        self.link_bytes: dict = {n: [] for n in names}
        self.codec_seconds: dict = {n: 0.0 for n in trainers}
        self.overlap: dict = {}


def blocks_of(trainer):
    """A contender's runner of a block of steps: plain, or through its run.pipeline
    (which fills at the block's start and drains at its end)."""
    return lambda block: deque(trainer.train_on(block), maxlen=0)


def build_contenders(args: argparse.Namespace, env) -> Contenders:
    """The first contender, each `--vs` one (its own run directory), torchrec's order with
    `--torchrec-order`, and plain TorchRec where the arch has a plain model."""
    from dlrmtrain.config import load_config
    from dlrmtrain.data.datasets import table_rows
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config, validate_config

    config, shape_overrides = shape_config(args)
    common = [*shape_overrides, "logging.progress_bar=false", "eval.enabled=false",
              "mlperf.enabled=false", "run.output_dir=/tmp/dlrmtrain-bench", "run.overwrite=true"]
    cfg = resolve_config(load_config(config, common))
    validate_config(cfg, env.world_size)
    race = Contenders(env, config, shape_overrides, cfg)
    race.add("dlrmtrain", Trainer(cfg, env))
    for i, vs in enumerate(args.vs):  # each its own run directory
        other_cfg = resolve_config(load_config(config, common + [f"run.name=bench_vs{i}"] + vs.split()))
        validate_config(other_cfg, env.world_size)
        race.add(f"dlrmtrain {vs}", Trainer(other_cfg, env))
    if args.torchrec_order:
        from dlrmtrain.models.dlrm import set_sparse_first
        order_cfg = resolve_config(load_config(config, common + ["run.name=bench_order"]))
        race.add("dlrmtrain (torchrec's order)", Trainer(order_cfg, env))
        set_sparse_first(race.trainers["dlrmtrain (torchrec's order)"].model, False)
        args.vs.append("(torchrec's order)")
    if not args.no_plain and cfg.model.arch not in PLAIN_ARCHS:
        args.no_plain = True
        if env.is_main:
            print(f"bench_train: TorchRec has no plain model for {cfg.model.arch}: "
                  "no plain contender", flush=True)
    if not args.no_plain:
        race.plain = build_plain_torchrec(cfg, table_rows(cfg), env.device, race.trainer.model.plan)
        race.steppers["plain TorchRec DMP"] = plain_stepper(*race.plain)
    return race


def plain_stepper(plain_model, plain_opt):
    def plain_step(block):
        for b in block:
            plain_opt.zero_grad()
            loss, _ = plain_model(b)
            loss.backward()
            plain_opt.step()
    return plain_step


def shared_batches(race: Contenders, args: argparse.Namespace) -> list:
    """The batches every contender steps over (warm-up, then the timed blocks); a contender that
    dedups at the source takes each one's distinct bags, made from it before any timing."""
    from dlrmtrain.workloads import build_datasets, workload_of

    env = race.env
    warmup = args.steps if args.warmup_steps is None else args.warmup_steps
    needed = args.steps * args.rounds + max(warmup, 1)
    batches = []
    epoch = 0
    # Full batches from a loader of their own: the first contender's loader hands out distinct
    # bags when it dedups at the source, and every contender must start from the same batches.
    full = build_datasets(race.trainer.cfg, env.rank, env.world_size)
    while len(batches) < needed:
        batches.extend(b.to(env.device) for b in full.train_batches(epoch))
        epoch += 1
    for name, t in race.trainers.items():  # the sample side (dedup at the source) takes its batches deduplicated
        if t.placement.side == "sample":
            race.steppers[name] = with_distinct_bags(race.steppers[name], t, batches,
                                                     workload_of(t.cfg).collection_kind)
    assert set(race.trainers) <= set(race.steppers)
    return batches


def time_contenders(race: Contenders, args: argparse.Namespace, batches: list) -> Timings:
    """Warm every contender up, then time alternating blocks (ABC, CBA, ...) of the same
    batches; last, profile one block of each for its all-to-alls."""
    import torch.distributed as dist

    trainers, names = race.trainers, list(race.steppers)
    timings = Timings(names, trainers)

    def timed(step, block, name=None) -> float:
        dist.barrier()
        sent0 = link_bytes_sent()
        codec0 = codec_seconds_so_far(trainers[name]) if name in trainers else 0.0
        t0 = time.perf_counter()
        step(block)
        dist.barrier()
        seconds = time.perf_counter() - t0
        if name and sent0 is not None:
            timings.link_bytes[name].append(between_nodes(link_bytes_sent() - sent0) / len(block))
        if name in trainers:
            timings.codec_seconds[name] += codec_seconds_so_far(trainers[name]) - codec0
        return seconds / len(block)

    warmup = args.steps if args.warmup_steps is None else args.warmup_steps
    for name in names:  # warm-up: untimed, over batches the timed blocks never see
        for first in range(0, warmup, max(args.steps, 1)):
            timed(race.steppers[name], batches[first:min(first + args.steps, warmup)])
    timed_batches = batches[warmup:]
    for r in range(args.rounds):
        block = timed_batches[args.steps * r: args.steps * (r + 1)]
        for name in (names if r % 2 == 0 else names[::-1]):
            timings.blocks[name].append(timed(race.steppers[name], block, name))
    timings.overlap = {n: all_to_all_profile(race.steppers[n], batches[:args.steps]) for n in names}
    return timings


def print_results(race: Contenders, args: argparse.Namespace, timings: Timings) -> None:
    """Rank 0's table: medians and blocks, the ratios, the codecs' time against the first
    contender's all-to-all, the free-codec bound, overlap and bytes; `--json` too."""
    cfg, names, width = race.cfg, list(race.steppers), max(24, *(len(n) + 2 for n in race.steppers))
    gbs = cfg.run.global_batch_size
    median = {n: statistics.median(b) for n, b in timings.blocks.items()}
    print("\n" + "=" * 72)
    print(f"bench_train: {race.env.world_size} Gloo ranks, global batch {gbs}, "
          f"{args.rounds} alternating blocks of {args.steps} steps (medians)")
    print(f"  config {Path(race.config).name} {' '.join(race.shape_overrides)}")
    print(f"  model {cfg.model.arch}, emb dim {cfg.model.embedding_dim}, "
          f"{len(race.trainer.data.table_rows)} tables, optimizer {cfg.optim.name}")
    print(f"  {'':{width}}{'ms/step':>10}{'samples/s':>14}   blocks (ms/step)")
    for name in names:
        print(f"  {name:<{width}}{1000 * median[name]:10.2f}{gbs / median[name]:14,.0f}   "
              + " ".join(f"{1000 * x:.1f}" for x in timings.blocks[name]))
    print_reference_wire(cfg.model.arch, names)
    base = names[0]
    for name in names[1:len(names) - (race.plain is not None)]:
        print(f"  ratio ({name}) / ({base}) step time: {median[name] / median[base]:.3f}")
    if race.plain is not None:
        for name in names[:-1]:
            goal = "  (goal ≤ 1.02)" if name == base else ""
            print(f"  ratio ({name}) / plain step time: "
                  f"{median[name] / median['plain TorchRec DMP']:.3f}{goal}")
    free_codec_bound = print_all_to_alls(race, args, timings, median, width)
    if all(timings.link_bytes.values()):
        where = ("between nodes per step (all nodes' links, summed)"
                 if "DLRMTRAIN_LINK_DEVICE" in os.environ else
                 "through lo per step (all ranks, both directions; exact only inside "
                 "shaped_link's private namespace)")
        print(f"  bytes {where}: " + ", ".join(f"{n} {statistics.median(b) / 1e6:.1f} MB"
                                             for n, b in timings.link_bytes.items()))
    wire_worth = print_wire_worth(names, median, timings.link_bytes)
    print("=" * 72)
    if args.json:
        Path(args.json).write_text(json.dumps(results_json(race, args, timings, median, {
            "free_codec_bound": free_codec_bound, "saved_bytes_wire_ratio": wire_worth}), indent=2) + "\n")


def print_all_to_alls(race: Contenders, args: argparse.Namespace, timings: Timings, median: dict,
                      width: int) -> float:
    """Each codec's time on the critical path against the first contender's embedding
    all-to-all, the free-codec bound (returned) and how much of each all-to-all was hidden."""
    names = list(race.steppers)
    base, base_all_to_all = names[0], timings.overlap[names[0]][0]
    steps_timed = args.steps * args.rounds
    print(f"  codec time on the critical path vs ({base})'s embedding all-to-all, rank 0 "
          f"(goal ≤ 20% at MLPerf's shape): all-to-alls {1000 * base_all_to_all:.1f} ms/step "
          "(embeddings and ids)")
    for name in race.trainers:
        ms = 1000 * timings.codec_seconds[name] / steps_timed
        if ms > 0:
            print(f"    {name:<{width}} codec {ms:7.1f} ms/step = "
                  f"{100 * ms / max(1000 * base_all_to_all, 1e-9):.0f}% of it")
    seconds, hidden = timings.overlap[base]
    free_codec_bound = 1 - seconds * (1 - hidden) / median[base]
    print(f"  bound: a free codec that moved nothing would step in "
          f"{free_codec_bound:.3f} of ({base})'s time (its exposed "
          "embedding all-to-all removed; Amdahl, rank 0; optimistic: ranks waiting for each "
          "other count as removed; scripts/bench_floor.py measures the floor)")
    print("  embedding all-to-all wall time hidden behind compute, rank 0 (one profiled block; "
          "a lower bound; rough):")
    for name in names:
        seconds, hidden = timings.overlap[name]
        print(f"    {name:<{width}} {1000 * seconds:7.1f} ms/step, {hidden:4.0%} hidden, "
              f"{1000 * seconds * (1 - hidden):7.1f} ms/step exposed")
    return free_codec_bound


def results_json(race: Contenders, args: argparse.Namespace, timings: Timings, median: dict,
                 bounds: dict) -> dict:
    """What `--json` writes: the run's shape, each contender's medians and blocks, bytes,
    codec and all-to-all times, and `bounds` (the free-codec bound, the wire's worth)."""
    cfg, steps_timed = race.cfg, args.steps * args.rounds
    return {
        "config": race.config, "overrides": race.shape_overrides, "world_size": race.env.world_size,
        "global_batch_size": cfg.run.global_batch_size, "steps": args.steps, "rounds": args.rounds,
        "sim_nodes": args.sim_nodes,
        "arch": cfg.model.arch, "ms_per_step": {n: 1000 * t for n, t in median.items()},
        "blocks_ms": {n: [1000 * x for x in b] for n, b in timings.blocks.items()},
        "loopback_mb_per_step": {n: statistics.median(b) / 1e6
                                 for n, b in timings.link_bytes.items() if b},
        "codec_ms_per_step": {n: 1000 * s / steps_timed for n, s in timings.codec_seconds.items()},
        "base_all_to_all_ms_per_step": 1000 * timings.overlap[next(iter(race.steppers))][0],
        "all_to_all_ms_per_step": {n: 1000 * o[0] for n, o in timings.overlap.items()},
        "all_to_all_hidden_fraction": {n: o[1] for n, o in timings.overlap.items()},
        **bounds,
    }


def close_contenders(race: Contenders) -> None:
    """Close every trainer's records and drop every sharded model, before the process group
    goes (docs/design.md §6)."""
    race.steppers.clear()
    for trainer in race.trainers.values():
        trainer.close()
    race.trainers.clear()
    race.plain = None


def main() -> None:
    args = parse_args(sys.argv[1:])
    if "RANK" not in os.environ:
        relaunch_under_torchrun(args)

    sys.path.insert(0, str(REPO))
    from dlrmtrain.distributed.env import shutdown_distributed
    from scripts.rank_start import start_cpu_rank

    env = start_cpu_rank()
    race = build_contenders(args, env)
    timings = time_contenders(race, args, shared_batches(race, args))
    if env.is_main:
        print_results(race, args, timings)
    close_contenders(race)
    del race
    shutdown_distributed()


if __name__ == "__main__":
    main()
