"""The `dlrmtrain` command (also `python -m dlrmtrain`): one entry for what users do.

    dlrmtrain train --config C [--nproc N] [--nnodes M --node-rank R --rdzv HOST:PORT]
                    [--link-gbit G [--link-latency-ms L]] [--sim-nodes M] [key=value ...]
    dlrmtrain preprocess --out DIR [--mode ...] RAW_FILES...
    dlrmtrain preprocess-yambda --events E --artists A --albums B --out DIR [--train-days N ...]
    dlrmtrain mlperf --config C --out DIR [--nproc N] [--rules official] [--link-gbit G] [key=value ...]
    dlrmtrain report RUN_DIR [RUN_DIR ...] [--out DIR]
    dlrmtrain plan --config C --gpus G --gpu-memory-gb M [--gpus-per-node K] [--host-memory-gb H] [key=value ...]

`train` reads and checks the config before any process starts (a bad key is one
line and exit 2), then starts the ranks with torchrun's launcher (dlrmtrain.launch).
Heavy imports (torch) happen only inside the subcommand that needs them, so the
first line appears at once.
"""

from __future__ import annotations

import argparse
import sys

from dlrmtrain.testbed.options import add_link_options, check_rate_options, without_link_options

EXIT_CONFIG_ERROR = 2
SUBCOMMANDS = ("train", "preprocess", "preprocess-yambda", "mlperf", "report", "plan")


def _train_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dlrmtrain train",
        description="Train on N ranks per node (torchrun in-process); the config is checked first.")
    p.add_argument("--config", required=True, help="run config (YAML)")
    p.add_argument("--nproc", type=int, default=1, help="ranks on this node (default: 1)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes in the job (default: 1)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index (default: 0)")
    p.add_argument("--rdzv", default=None,
                   help="HOST:PORT of the c10d rendezvous, the same on every node (multi-node)")
    p.add_argument("--rdzv-id", default=None, help="job id shared by the nodes "
                   "(default: $SLURM_JOB_ID, else dlrmtrain)")
    p.add_argument("--local-addr", default=None,
                   help="address this node advertises (default: 127.0.0.1 for a local rendezvous)")
    add_link_options(p)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return p


def _link_of(args: argparse.Namespace):
    """The link asked for: a shaped loopback (LinkSpec), simulated nodes (SimNodes) or
    None; ValueError when it cannot be had here."""
    check_rate_options(args.link_gbit, args.link_latency_ms, "link-")
    if args.sim_nodes is not None:
        return _sim_nodes_of(args)
    if args.link_gbit is None:
        return None
    from dlrmtrain.testbed.shaped_link import LinkSpec, unavailable_reason

    if args.nnodes > 1:
        raise ValueError("--link-gbit shapes this machine's own loopback: one node only")
    link = LinkSpec(args.link_gbit, args.link_latency_ms)
    reason = unavailable_reason()
    if reason:
        raise ValueError(f"--link-gbit: {reason}")
    return link


def _sim_nodes_of(args: argparse.Namespace):
    from dlrmtrain.testbed.shaped_link import LinkSpec
    from dlrmtrain.testbed.sim_nodes import SimNodes, unavailable_reason

    if args.nnodes > 1 or args.rdzv:
        raise ValueError("--sim-nodes runs every node on this machine: leave out --nnodes, "
                         "--node-rank and --rdzv")
    try:
        link = None if args.link_gbit is None else LinkSpec(args.link_gbit, args.link_latency_ms)
        sim = SimNodes(args.sim_nodes, link)
    except ValueError as e:
        raise ValueError(f"--sim-nodes: {e}") from None
    reason = unavailable_reason(sim.nodes)
    if reason:
        raise ValueError(f"--sim-nodes: {reason}")
    return sim


def describe_run(cfg, world_size: int, nnodes: int) -> str:
    """One line saying what is about to be built."""
    from pathlib import Path

    where = f"{world_size} rank{'s' if world_size > 1 else ''}"
    if nnodes > 1:
        where += f" on {nnodes} nodes"
    if cfg.data.table_sizes is not None:
        tables = f"{len(cfg.data.table_sizes)} tables"
    elif cfg.data.source == "synthetic":
        tables = f"tables of the synthetic {cfg.data.synthetic.profile} profile"
    else:
        tables = "table sizes from the dataset"
    return (f"dlrmtrain: building {cfg.run.name}: {cfg.model.arch}, {tables}, "
            f"{cfg.data.source} data, codec {cfg.comm.codec}, {where}; "
            f"run directory {Path(cfg.run.output_dir) / cfg.run.name}")


def train(argv: list[str]) -> int:
    from dlrmtrain.run.parent import stop_with_owner

    stop_with_owner()  # started by the mlperf runner: never outlive it
    args = _train_parser().parse_intermixed_args(argv)
    from dlrmtrain.config import ConfigError, load_config
    from dlrmtrain.launch import LaunchSpec

    spec = LaunchSpec(nproc=args.nproc, nnodes=args.nnodes, node_rank=args.node_rank,
                      rdzv=args.rdzv, rdzv_id=args.rdzv_id, local_addr=args.local_addr,
                      args=["--config", args.config, *args.overrides])
    try:
        spec.check()
        link = _link_of(args)
        nnodes = link.nodes if args.sim_nodes is not None else spec.nnodes
        cfg = load_config(args.config, args.overrides)
        print(describe_run(cfg, spec.nproc * nnodes, nnodes), flush=True)
        from dlrmtrain.validation import validate_config  # imports torch: seconds

        validate_config(cfg, world_size=spec.nproc * nnodes)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except ValueError as e:  # launch options
        print(f"dlrmtrain train: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    from dlrmtrain.relaunch import relaunch

    if args.sim_nodes is not None:  # one torchrun agent per simulated node
        print(f"dlrmtrain: {link.describe()}", flush=True)
    # behind a shaped link: the same command again, inside the shaped namespace
    return relaunch(spec, link, [sys.executable, "-m", "dlrmtrain", "train",
                                 *without_link_options(argv)])


def preprocess(argv: list[str]) -> int:
    from dlrmtrain.data.preprocess.cli import main

    return main(argv, prog="dlrmtrain preprocess")


def preprocess_yambda(argv: list[str]) -> int:
    from dlrmtrain.data.yambda.preprocess import main

    return main(argv, prog="dlrmtrain preprocess-yambda")


def mlperf(argv: list[str]) -> int:
    from dlrmtrain.mlperf_runner import main

    return main(argv)


def report(argv: list[str]) -> int:
    from dlrmtrain.report import main

    return main(argv)


def plan(argv: list[str]) -> int:
    from dlrmtrain.plan.command import main

    return main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[1])
        print("`dlrmtrain SUBCOMMAND --help` lists each one's options.")
        return 0 if argv else EXIT_CONFIG_ERROR
    command, rest = argv[0], argv[1:]
    if command not in SUBCOMMANDS:
        print(f"dlrmtrain: unknown subcommand {command!r} (one of: {', '.join(SUBCOMMANDS)})",
              file=sys.stderr)
        return EXIT_CONFIG_ERROR
    try:
        return {"train": train, "preprocess": preprocess, "preprocess-yambda": preprocess_yambda,
                "mlperf": mlperf, "report": report, "plan": plan}[command](rest)
    except KeyboardInterrupt:  # Ctrl-C before the ranks start (torchrun handles it after)
        print(f"dlrmtrain {command}: interrupted by SIGINT", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
