"""The testbed's options on a command that trains (`dlrmtrain train`, `dlrmtrain mlperf`,
scripts/bench_train.py): one shaped loopback, or simulated nodes joined by shaped links.
Argparse only, so a command line that declares them imports nothing heavy."""

from __future__ import annotations

import argparse

LINK_OPTIONS = ("--link-gbit", "--link-latency-ms", "--sim-nodes")


def add_link_options(p: argparse.ArgumentParser, ranks_per_node: str = "of --nproc ranks each") -> None:
    """`LINK_OPTIONS` on `p`; `ranks_per_node` says how `--sim-nodes` makes its nodes of the command's ranks."""
    add_rate_options(p, "run behind a private loopback shaped to G Gbit/s, one link shared by all "
                        "ranks and both directions (one node; needs root, unshare and tc)", prefix="link-")
    p.add_argument("--sim-nodes", type=int, default=None,
                   help=f"simulate N nodes {ranks_per_node} on this machine: a private network "
                        "namespace per node, only traffic between nodes crosses the link "
                        "(--link-gbit each way per node; unshaped without it); needs root, "
                        "unshare, ip, tc")


def add_rate_options(p: argparse.ArgumentParser, gbit_help: str, prefix: str = "", required: bool = False) -> None:
    """A shaped link's rate and added delay, `--{prefix}gbit` and `--{prefix}latency-ms` (every testbed
    command line: the options above, shaped_link's and sim_nodes')."""
    p.add_argument(f"--{prefix}gbit", type=float, default=None, required=required, help=gbit_help)
    p.add_argument(f"--{prefix}latency-ms", type=float, default=0.0,
                   help=f"with --{prefix}gbit: one-way delay added per packet (needs the kernel's netem qdisc)")


def check_rate_options(gbit: float | None, latency_ms: float, prefix: str = "") -> None:
    """ValueError when a delay is asked for without a rate: it would be dropped (no link is made)."""
    if gbit is None and latency_ms:
        raise ValueError(f"--{prefix}latency-ms needs --{prefix}gbit (no link is shaped without a rate)")


def without_link_options(argv: list[str]) -> list[str]:
    """`argv` less the link options (and their values): the command to run behind the link."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in LINK_OPTIONS:
            skip = True
        elif not token.startswith(tuple(f"{o}=" for o in LINK_OPTIONS)):
            out.append(token)
    return out
