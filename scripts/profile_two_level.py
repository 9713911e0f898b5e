"""Where the two-level dedup's time goes, side by side with one-level dedup, per hop.

    python scripts/profile_two_level.py [--sim-nodes 2] [--world-size 4] [--gbit 1]
        [--steps 3] [--rounds 3] [--warmup-steps 3] [--config C] [overrides...]

Trains `dedup` and `dedup` with `comm.hierarchy: node` (two Trainers over the
same pre-built batches) in alternating blocks (AB, BA, ...) on simulated nodes
behind a shaped link (dlrmtrain.testbed.sim_nodes; unshaped with --gbit 0),
or on plain loopback with `--sim-nodes 0` (comm.ranks_per_node set instead).
Prints, as medians over the blocks, each contender's step time split into
forward / backward / optimizer, the CPU time its rank's process used (all
threads: on a machine with fewer cores than ranks the step is CPU-bound, and
this figure does not depend on what else runs), its codec and transfer time, and for the
two-level path the comm stats' time per hop (`comm.stats.HOPS`) with the plan's
pieces (id exchange, uniques, host sync, index building) timed by wrappers;
every figure is the mean over ranks, and the slowest rank's in brackets.
Needs root, unshare, ip and tc for the simulated nodes; without them it says so.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.profile_dedup import wrap_calls  # noqa: E402  (after the path: run as a script)

CONTENDERS = {"dedup": [], "two-level": ["comm.hierarchy=node"]}
PLAN_PIECES: collections.Counter = collections.Counter()
"""seconds per wrapped function of the two-level planner (this rank)"""
EVENTS: list[tuple[str, float, float]] = []
"""(what, start, end) of this rank's last step: time.perf_counter is CLOCK_MONOTONIC, one
clock for every process of the machine, so the ranks' timelines line up"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(REPO / "configs/mini_mlperf_dim128.yaml"))
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--sim-nodes", type=int, default=2, help="0: plain loopback, comm.ranks_per_node")
    p.add_argument("--gbit", type=float, default=1.0, help="each node's link; 0: unshaped")
    p.add_argument("--steps", type=int, default=3, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=3, help="timed blocks per contender")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--timeline", action="store_true",
                   help="print every rank's timeline of the last timed step of each contender")
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def relaunch(args: argparse.Namespace) -> None:
    """Become one torchrun agent per simulated node (or one on plain loopback): dlrmtrain.relaunch."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from dlrmtrain.launch import LaunchSpec
    from dlrmtrain.relaunch import relaunch as launch_ranks
    from dlrmtrain.testbed.shaped_link import LinkSpec, ShapedLinkUnavailable
    from dlrmtrain.testbed.sim_nodes import SimNodes

    try:
        sim, nodes = None, 1
        if args.sim_nodes:
            sim = SimNodes(args.sim_nodes, LinkSpec(args.gbit) if args.gbit else None)
            nodes = sim.nodes
            print(f"profile_two_level: {sim.describe()}, {args.world_size // sim.nodes} ranks each", flush=True)
        spec = LaunchSpec(nproc=args.world_size // nodes, script=__file__, args=sys.argv[1:],
                          omp_threads=1)
        sys.exit(launch_ranks(spec, sim, []))
    except (ShapedLinkUnavailable, ValueError) as e:
        raise SystemExit(f"profile_two_level: {e}") from None


def wrap_plan_pieces() -> None:
    """Time the two-level planner's pieces: its public phases and the public functions it calls
    (wrapped where they are looked up)."""
    from dlrmtrain.comm.dedup.two_level import node_ids, table_wise

    def timed(owner, name: str, label: str) -> None:
        def record(_args, t0: float, t1: float) -> None:
            PLAN_PIECES[label] += t1 - t0
            EVENTS.append((f"  {label}", t0, t1))
        wrap_calls(owner, name, record)

    for name in ("start_node_ids", "finish_node_ids"):
        timed(node_ids, name, name)
    for name in ("blocks_unique", "node_subsets"):
        timed(table_wise, name, name)
    for name in ("build_plan", "plan_stage_two", "account"):
        timed(table_wise.TwoLevelPlanner, name, f"TwoLevelPlanner.{name}")


def trace_events() -> None:
    """Record when each rank plans, waits and runs each hop (`--timeline`)."""
    from dlrmtrain.comm.dedup import dist as dedup_dist, transport
    from dlrmtrain.comm.dedup.two_level import transport as two_level_transport

    def traced(owner, name: str, label) -> None:
        wrap_calls(owner, name, lambda a, t0, t1: EVENTS.append(
            (label(*a) if callable(label) else label, t0, t1)))

    traced(dedup_dist.DedupDist, "forward", "plan+launch")
    # both transports wait through `timed_wait` (hop None: one level) and count codec time per hop
    # through `count_codec`, each looked up in its own module
    wait_label = lambda work, stats, device, hop=None: "wait (one-level)" if hop is None else f"wait {hop}"  # noqa: E731
    traced(transport, "timed_wait", wait_label)
    traced(two_level_transport, "timed_wait", wait_label)

    def codec(stats, t0, device, hop=None):  # host stamps: the timeline runs on CPU
        t1 = count_codec(stats, t0, device, hop)
        EVENTS.append((hop or "codec", t0, t1))
        return t1
    count_codec = two_level_transport.count_codec
    two_level_transport.count_codec = codec


def print_timelines(per_rank: list[dict[str, list]], names: list[str]) -> None:
    """Each contender's last step: every rank's events, ms from the earliest forward start."""
    for name in names:
        events = [(r, *e) for r, t in enumerate(per_rank) for e in t.get(name, [])]
        if not events:
            continue
        origin = min(e[2] for e in events if e[1] == "forward")
        print(f"\ntimeline, {name} (last timed step; ms from the first rank's forward start)")
        for r, what, t0, t1 in sorted(events, key=lambda e: (e[2], e[0])):
            print(f"  rank {r} {1e3 * (t0 - origin):8.1f} {1e3 * (t1 - origin):8.1f}  {1e3 * (t1 - t0):7.1f}  {what}")


def build_trainers(args: argparse.Namespace, env) -> dict:
    """A Trainer per contender (its own run directory), both owner-side dedup."""
    from dlrmtrain.config import load_config
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config, validate_config

    common = ["logging.progress_bar=false", "eval.enabled=false", "mlperf.enabled=false",
              "run.output_dir=/tmp/dlrmtrain-profile", "run.overwrite=true", "comm.codec=dedup",
              "comm.dedup_at=owner",  # one level against two, both owner-side (two levels have no source path)
              *args.overrides]
    if not args.sim_nodes:
        common.append(f"comm.ranks_per_node={args.world_size // 2}")
    trainers = {}
    for i, (name, extra) in enumerate(CONTENDERS.items()):
        cfg = resolve_config(load_config(args.config, common + [f"run.name=profile{i}", *extra]))
        validate_config(cfg, env.world_size)
        trainers[name] = Trainer(cfg, env)
    return trainers


def counters(trainer) -> dict[str, float]:
    """The trainer's codec, transfer and per-hop seconds so far (comm stats)."""
    from dlrmtrain.comm.stats import collect_comm_stats

    s = collect_comm_stats(trainer.comm_counters)
    n = s["steps"]
    return {"codec": s["codec_seconds_per_step"] * n, "transfer": s["transfer_seconds_per_step"] * n,
            **{f"hop {k}": v * n / 1e3 for k, v in s["hop_ms_per_step"].items()}}


def block(name: str, trainer, bs) -> dict[str, float]:
    """Seconds per step of one block: the step, its phases, the codec counters."""
    import torch.distributed as dist

    times: collections.Counter = collections.Counter()
    before, pieces = counters(trainer), PLAN_PIECES.copy()
    dist.barrier()
    t_start, cpu_start = time.perf_counter(), time.process_time()
    for b in bs:
        EVENTS.clear()
        trainer.schedule.apply(trainer.step + 1, [trainer.optimizer])
        trainer.step += 1
        t0 = time.perf_counter()
        trainer.optimizer.zero_grad()
        loss, _ = trainer.model(b)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        trainer.optimizer.step()
        t3 = time.perf_counter()
        EVENTS.extend([("forward", t0, t1), ("backward", t1, t2), ("optimizer", t2, t3)])
        times["forward"] += t1 - t0
        times["backward"] += t2 - t1
        times["optimizer"] += t3 - t2
    times["cpu (all threads)"] = time.process_time() - cpu_start
    dist.barrier()
    times["step"] = time.perf_counter() - t_start
    after = counters(trainer)
    for k, v in after.items():
        times[k] += v - before.get(k, 0.0)
    if name == "two-level":
        for k, v in PLAN_PIECES.items():
            times[f"plan: {k}"] += v - pieces.get(k, 0.0)
    return {k: v / len(bs) for k, v in times.items()}


def run_rounds(trainers: dict, args: argparse.Namespace, batches: list) -> tuple[dict, dict]:
    """Warm each contender up, then alternating blocks (AB, BA, ...): each block's seconds per
    step by contender, and each contender's events of its last timed step."""
    names = list(trainers)
    for name in names:
        block(name, trainers[name], batches[:args.warmup_steps])
    results: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    timelines: dict[str, list] = {}
    timed = batches[args.warmup_steps:]
    for r in range(args.rounds):
        bs = timed[args.steps * r:args.steps * (r + 1)]
        for name in (names if r % 2 == 0 else names[::-1]):
            results[name].append(block(name, trainers[name], bs))
            timelines[name] = list(EVENTS)
    return results, timelines


def print_table(args: argparse.Namespace, world_size: int, gathered: list, results: dict) -> None:
    """Rank 0's table: each figure's median, mean over ranks [slowest rank], and the ratios."""
    names = list(results)
    print("\n" + "=" * 72)
    print(f"profile_two_level: {world_size} ranks, {args.sim_nodes or 'no'} simulated nodes "
          f"({args.gbit:g} Gbit/s)" if args.sim_nodes else f"profile_two_level: {world_size} ranks")
    print(f"  {args.rounds} alternating blocks of {args.steps} steps, medians; ms/step, "
          "mean over ranks [slowest rank]")
    keys = list(dict.fromkeys(k for n in names for k in gathered[0][n]))
    print(f"  {'':36}" + "".join(f"{n:>22}" for n in names))
    for k in keys:
        cells = []
        for n in names:
            vals = [g[n].get(k) for g in gathered]
            if any(v is None for v in vals):
                cells.append(f"{'':>22}")
                continue
            cells.append(f"{1e3 * statistics.mean(vals):12.1f} [{1e3 * max(vals):7.1f}]")
        print(f"  {k:<36}" + "".join(cells))
    base = statistics.mean(g["dedup"]["step"] for g in gathered)
    two = statistics.mean(g["two-level"]["step"] for g in gathered)
    print(f"  ratio two-level / dedup step time: {two / base:.3f} (of the medians)")
    # each round's two blocks ran back to back: their ratio sees the same machine load
    paired = sorted(t["step"] / d["step"] for d, t in zip(results["dedup"], results["two-level"]))
    print(f"  per round (adjacent blocks): median {statistics.median(paired):.3f}, "
          f"range {paired[0]:.3f}-{paired[-1]:.3f} over {len(paired)} rounds")
    print("=" * 72, flush=True)


def main() -> None:
    args = parse_args(sys.argv[1:])
    if "RANK" not in os.environ:
        relaunch(args)
    import torch.distributed as dist

    from dlrmtrain.distributed.env import shutdown_distributed
    from scripts.rank_start import start_cpu_rank

    env = start_cpu_rank()
    wrap_plan_pieces()
    if args.timeline:
        trace_events()
    trainers = build_trainers(args, env)
    first = next(iter(trainers.values()))
    needed = args.warmup_steps + args.steps * args.rounds
    batches, epoch = [], 0
    while len(batches) < needed:
        batches.extend(b.to(env.device) for b in first.data.train_batches(epoch))
        epoch += 1
    results, timelines = run_rounds(trainers, args, batches)
    medians = {n: {k: statistics.median(b.get(k, 0.0) for b in blocks) for k in blocks[0]}
               for n, blocks in results.items()}
    gathered: list = [None] * env.world_size
    dist.all_gather_object(gathered, medians)
    all_timelines: list = [None] * env.world_size
    dist.all_gather_object(all_timelines, timelines)
    if env.is_main and args.timeline:
        print_timelines(all_timelines, list(trainers))
    if env.is_main:
        print_table(args, env.world_size, gathered, results)
    for t in trainers.values():
        t.close()
    del trainers, first
    shutdown_distributed()


if __name__ == "__main__":
    main()
