"""A bandwidth-limited link on one machine: run a command (torchrun and its ranks)
in a private network namespace whose loopback is shaped with `tc`.

    python -m dlrmtrain.testbed.shaped_link --gbit 1 -- torchrun --standalone ...
    python -m dlrmtrain.testbed.shaped_link --gbit 1 --probe-mb 125   # check the rate

`unshare --net` gives the command a network namespace of its own with only a
loopback device; it is brought up and a token-bucket filter (tbf) is put on it,
so every byte the ranks exchange over 127.0.0.1 (Gloo, the rendezvous store)
passes the bucket. Nothing leaves the namespace: it has no other device.

What the link is: ONE link shared by all ranks and both directions. Every packet
on loopback is sent once through lo's root qdisc, so the rate caps the sum of all
ranks' traffic in both directions, not each rank's send rate. A 2-rank all-to-all
that moves B bytes each way takes at least 2B / rate; on a real NIC each direction
of each rank would have its own rate.

Settings that keep tbf accurate from 0.5 to 10 Gbit/s on loopback (MTU 65536,
and GSO hands tbf packets up to 64 KiB): the bucket (`burst`) holds at least two
maximal packets and about 0.5 ms of traffic, so the rate is not starved by timer
granularity at 10 Gbit/s and a burst is short relative to any transfer worth
measuring at 0.5 Gbit/s; the queue (`latency`) is long enough (200 ms) that TCP
never sees a drop (a dropped packet on loopback costs a 200 ms retransmit
timeout, which would measure the timer, not the link).

Latency (`--latency-ms`) needs the kernel's netem qdisc, placed above tbf; on
loopback it delays each packet once, so a round trip costs twice the latency.
Needs root, `unshare` and `tc`; without them it says which is missing and stops.
Several nodes where only the traffic between nodes is shaped: sim_nodes.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

from dlrmtrain.comm.auto.policy import LINK_RATE_ENV
from dlrmtrain.testbed.options import add_rate_options

MAX_LOOPBACK_PACKET = 65536
QUEUE_LATENCY_MS = 200


class ShapedLinkUnavailable(RuntimeError):
    """This machine cannot shape a private loopback (the message says why)."""


@dataclass(frozen=True)
class LinkSpec:
    gbit: float
    """Rate of the one shared link, Gbit/s (10**9 bit/s)."""
    latency_ms: float = 0.0
    """Added one-way delay per packet (netem); 0 = none."""

    def __post_init__(self) -> None:
        if not self.gbit > 0:
            raise ValueError(f"link rate must be > 0 Gbit/s, got {self.gbit}")
        if self.latency_ms < 0:
            raise ValueError(f"link latency must be >= 0 ms, got {self.latency_ms}")

    @property
    def bytes_per_s(self) -> float:
        return self.gbit * 1e9 / 8

    def burst_bytes(self) -> int:
        return max(2 * MAX_LOOPBACK_PACKET, int(self.bytes_per_s * 0.0005))

    def tc_commands(self, dev: str = "lo", netns: str | None = None,
                    delay: bool = True) -> list[list[str]]:
        """The tc commands that shape the egress of `dev` (default: this namespace's `lo`;
        `netns`: a named namespace's device). `delay=False` leaves out the latency
        (sim_nodes delays each packet once, at the sending node's end)."""
        tc = ["tc", *(["-n", netns] if netns else []), "qdisc", "add", "dev", dev]
        tbf = ["tbf", "rate", f"{int(self.gbit * 1e9)}bit", "burst", str(self.burst_bytes()),
               "latency", f"{QUEUE_LATENCY_MS}ms"]
        if not (self.latency_ms and delay):
            return [[*tc, "root", "handle", "1:", *tbf]]
        return [[*tc, "root", "handle", "1:", "netem",
                 "delay", f"{self.latency_ms}ms", "limit", "100000"],
                [*tc, "parent", "1:1", "handle", "10:", *tbf]]

    def describe(self) -> str:
        lat = f", +{self.latency_ms:g} ms per packet" if self.latency_ms else ""
        return f"{self.gbit:g} Gbit/s shared loopback{lat}"


def unavailable_reason() -> str | None:
    """Why a shaped link cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "a shaped link needs root (unshare --net and tc on the namespace's lo)"
    for tool in ("unshare", "tc", "ip"):
        if shutil.which(tool) is None:
            return f"a shaped link needs `{tool}`, which is not on PATH"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`unshare --net` failed here: {probe.stderr.strip() or probe.returncode}"
    return None


def require_available() -> None:
    reason = unavailable_reason()
    if reason:
        raise ShapedLinkUnavailable(reason)


def wrap_command(cmd: list[str], link: LinkSpec | None) -> list[str]:
    """The command line that runs `cmd` behind `link` (unchanged when link is None)."""
    if link is None:
        return list(cmd)
    require_available()
    inner = [sys.executable, "-m", "dlrmtrain.testbed.shaped_link", "--inside",
             "--gbit", repr(link.gbit), "--latency-ms", repr(link.latency_ms), "--", *cmd]
    return ["unshare", "--net", "--", *inner]


def run_steps(steps: list[list[str]]) -> None:
    """Run each command (ip, tc, ...) in turn; the first failure says which and why."""
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            why = done.stderr.strip()
            if "netem" in step and "unknown" in why.lower():
                why += " (this kernel has no netem qdisc: run without --latency-ms)"
            raise ShapedLinkUnavailable(f"`{' '.join(step)}` failed: {why}")


def shape_loopback(link: LinkSpec) -> None:
    """Inside a fresh namespace: bring lo up and put the link's qdiscs on it."""
    run_steps([["ip", "link", "set", "lo", "up"], *link.tc_commands()])


def run_inside(link: LinkSpec, cmd: list[str]) -> int:
    """Shape, then become `cmd` (its exit status is the launcher's)."""
    if not cmd:
        raise SystemExit("shaped_link: no command given after --")
    shape_loopback(link)
    # Gloo would otherwise pick the interface that the hostname resolves to.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ[LINK_RATE_ENV] = repr(link.gbit)  # codec auto weighs its bytes at this rate
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        raise ShapedLinkUnavailable(f"cannot run {cmd[0]!r} behind the link: {e}") from None
    return 1  # not reached


def tcp_transfer(nbytes: int) -> tuple[int, float]:
    """Send `nbytes` over one TCP connection on 127.0.0.1; (bytes received, seconds
    from the first byte sent to the last received)."""
    received = [0]
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def receive() -> None:
            conn, _ = server.accept()
            with conn:
                while chunk := conn.recv(1 << 20):
                    received[0] += len(chunk)

        receiver = threading.Thread(target=receive)
        receiver.start()
        with socket.create_connection(server.getsockname()) as client:
            chunk = b"x" * (1 << 20)
            t0 = time.perf_counter()
            for start in range(0, nbytes, len(chunk)):
                client.sendall(chunk[:min(len(chunk), nbytes - start)])
        receiver.join()
        return received[0], time.perf_counter() - t0


def command_of(args: argparse.Namespace) -> list[str]:
    """The command given after `--` (argparse's REMAINDER keeps the `--`)."""
    return args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd


def exit_status(prog: str, run: Callable[[], int]) -> int:
    """`run()`'s exit status, or 2 with `prog: why` on stderr where the link (or the simulated
    nodes) cannot be had here: a missing tool or right, a bad rate or node count."""
    try:
        return run()
    except (ShapedLinkUnavailable, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2


def _behind_the_link(p: argparse.ArgumentParser, args: argparse.Namespace, cmd: list[str]) -> int:
    """The command run behind the link (from outside: in a namespace of its own made first)."""
    link = LinkSpec(args.gbit, args.latency_ms)
    if args.inside:
        return run_inside(link, cmd)
    if not cmd:
        p.error("no command given after --")
    return subprocess.run(wrap_command(cmd, link)).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_rate_options(p, "link rate, Gbit/s", required=True)
    p.add_argument("--probe-mb", type=float, default=None,
                   help="instead of a command: time a TCP transfer of this many MB through the link")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tcp-transfer", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command to run behind the link")
    args = p.parse_args(argv)
    cmd = command_of(args)
    if args.tcp_transfer is not None:  # the probe itself, already behind the link
        moved, seconds = tcp_transfer(args.tcp_transfer)
        print(f"{moved} bytes in {seconds:.3f} s = {moved * 8 / seconds / 1e9:.3f} Gbit/s "
              f"through a {args.gbit:g} Gbit/s link")
        return 0
    if args.probe_mb is not None:
        cmd = [sys.executable, "-m", "dlrmtrain.testbed.shaped_link", "--gbit", repr(args.gbit),
               "--tcp-transfer", str(int(args.probe_mb * 1e6))]
    return exit_status("shaped_link", lambda: _behind_the_link(p, args, cmd))


if __name__ == "__main__":
    sys.exit(main())
