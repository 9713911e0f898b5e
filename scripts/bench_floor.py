"""How fast could a step be with no communication at all? The floor no codec can beat.

    python scripts/bench_floor.py [--shape mlperf] [--world-size 2] [--rounds 2]
        [--steps 5] [--warmup-steps 3] [--vs "KEY=VALUE ..."]... [--link-gbit G] [overrides...]

Alternates, round by round (ABBA...), two things on this machine:
  ranks   `bench_train` over --world-size Gloo ranks: dlrmtrain with the shape's config
          (the first contender) and each `--vs` contender, side by side;
  alone   --world-size single-rank `bench_train` runs at once, each with the local batch
          (global batch / world size), every table on its one rank, no all-to-all and no
          all-reduce: the same arithmetic per process and the same contention for the cores,
          without any communication.
and prints the medians over rounds and each one's ratio to the first contender. The
free-codec bound `bench_train` prints removes the first contender's exposed all-to-all
time; on a loaded CPU part of that time is ranks waiting for each other, which a codec
cannot remove, so `alone` is the harder floor: a codec that beats it saves work, not bytes.
With `--link-gbit G` the ranks run behind one shaped loopback (bench_train's); the runs alone
send nothing, so theirs is the same floor at any rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dlrmtrain.testbed.options import add_rate_options, check_rate_options  # noqa: E402  (argparse only)

BENCH = REPO / "scripts" / "bench_train.py"
ALONE = "alone (no communication)"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="mlperf", choices=sorted(load_bench_train().SHAPES),
                   help="a bench_train shape (default mlperf)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="alternations of ranks and alone")
    p.add_argument("--steps", type=int, default=5, help="steps per timed block")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--vs", action="append", default=[], metavar="OVERRIDES",
                   help="a contender beside the shape's config, as bench_train's --vs")
    add_rate_options(p, "the ranks behind one loopback shaped to G Gbit/s (bench_train's --link-gbit)",
                     prefix="link-")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    try:
        check_rate_options(args.link_gbit, args.link_latency_ms, "link-")
    except ValueError as e:
        p.error(str(e))
    if args.world_size < 2:
        p.error("--world-size must be at least 2 (one rank alone has nothing to communicate)")
    return args


def global_batch(shape: str, overrides: list[str]) -> int:
    from dlrmtrain.config import load_config

    config, shape_overrides = load_bench_train().SHAPES[shape]
    return load_config(REPO / config, [*shape_overrides, *overrides]).run.global_batch_size


def load_bench_train():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ranks_command(args: argparse.Namespace, out: Path) -> list[str]:
    return [sys.executable, str(BENCH), "--shape", args.shape, "--world-size", str(args.world_size),
            "--steps", str(args.steps), "--rounds", "1", "--warmup-steps", str(args.warmup_steps),
            "--no-plain", "--json", str(out), *(f"--vs={vs}" for vs in args.vs), *link_options(args),
            *args.overrides]


def link_options(args: argparse.Namespace) -> list[str]:
    if args.link_gbit is None:
        return []
    return ["--link-gbit", str(args.link_gbit), "--link-latency-ms", str(args.link_latency_ms)]


def alone_command(args: argparse.Namespace, local_batch: int, i: int, out: Path) -> list[str]:
    return [sys.executable, str(BENCH), "--shape", args.shape, "--world-size", "1",
            "--steps", str(args.steps), "--rounds", "1", "--warmup-steps", str(args.warmup_steps),
            "--no-plain", "--json", str(out), *args.overrides,
            f"run.global_batch_size={local_batch}", f"run.name=bench_floor_alone{i}"]


def run_all(commands: list[list[str]], logs: list[Path]) -> None:
    """Run the commands at once; a failure ends the benchmark naming its log."""
    procs = [subprocess.Popen(c, stdout=log.open("w"), stderr=subprocess.STDOUT)
             for c, log in zip(commands, logs)]
    for p, log in zip(procs, logs):
        if p.wait() != 0:
            raise SystemExit(f"bench_floor: a run failed (exit {p.returncode}); its output: {log}")


def alone_ms(results: list[dict]) -> float:
    """The processes that ran alone at once: their mean ms per step (each one's median)."""
    return statistics.mean(next(iter(r["ms_per_step"].values())) for r in results)


def summary(rounds: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Medians over rounds per contender, and each one's ratio to the first contender."""
    names = list(rounds[0])
    median = {n: statistics.median(r[n] for r in rounds) for n in names}
    return median, {n: median[n] / median[names[0]] for n in names[1:]}


def one_round(args: argparse.Namespace, local_batch: int, k: int, work: Path) -> dict[str, float]:
    ranks_json, alone_json = work / f"ranks{k}.json", [work / f"alone{k}_{i}.json" for i in range(args.world_size)]
    ranks = ([ranks_command(args, ranks_json)], [work / f"ranks{k}.log"])
    alone = ([alone_command(args, local_batch, i, j) for i, j in enumerate(alone_json)],
             [work / f"alone{k}_{i}.log" for i in range(args.world_size)])
    for commands, logs in ((ranks, alone) if k % 2 == 0 else (alone, ranks)):  # ABBA
        print(f"bench_floor: round {k + 1}/{args.rounds}: {len(commands)} run(s), output in {logs[0].parent}",
              flush=True)
        run_all(commands, logs)
    result = json.loads(ranks_json.read_text())["ms_per_step"]
    result[ALONE] = alone_ms([json.loads(j.read_text()) for j in alone_json])
    return result


def main() -> None:
    args = parse_args(sys.argv[1:])
    gbs = global_batch(args.shape, args.overrides)
    if gbs % args.world_size:
        raise SystemExit(f"bench_floor: global batch {gbs} does not split into {args.world_size} ranks")
    work = Path(tempfile.mkdtemp(prefix="bench_floor_"))
    rounds = [one_round(args, gbs // args.world_size, k, work) for k in range(args.rounds)]
    median, ratio = summary(rounds)
    width = max(len(n) for n in median) + 2
    print("\n" + "=" * 72)
    link = f" behind {args.link_gbit} Gbit/s" if args.link_gbit is not None else ""
    print(f"bench_floor: shape {args.shape}, {args.world_size} ranks{link} against {args.world_size} "
          f"single-rank runs at once (local batch {gbs // args.world_size}), {args.rounds} rounds "
          f"of one {args.steps}-step block (medians)")
    for name in median:
        print(f"  {name:<{width}}{median[name]:10.2f} ms/step   rounds: "
              + " ".join(f"{r[name]:.1f}" for r in rounds))
    base = next(iter(median))
    for name, r in ratio.items():
        print(f"  ratio ({name}) / ({base}): {r:.3f}")
    print(f"  ({ALONE}: no all-to-all, no all-reduce; what no codec can beat here)")
    print("=" * 72)


if __name__ == "__main__":
    main()
