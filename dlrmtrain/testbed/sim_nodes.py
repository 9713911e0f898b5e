"""Simulated nodes on one machine: N network namespaces of L ranks each, where only
the traffic between nodes crosses a shaped link.

    dlrmtrain train --sim-nodes 2 --nproc 2 --link-gbit 1 --config C    # 2 nodes x 2 ranks
    python -m dlrmtrain.testbed.sim_nodes --nodes 2 --gbit 1 --probe-mb 100   # check it
    python -m dlrmtrain.testbed.sim_nodes --nodes 2 --gbit 1 -- CMD ...       # any command

The whole simulation lives in one private namespace (`unshare --net --mount`,
with a private tmpfs on /run so that `ip netns` keeps its names there). Inside
it, each node is a child network namespace `node<i>` with:
- its own `lo`: traffic between the ranks of one node, never shaped;
- one end of a veth, `simlink`, addressed 127.100.0.<i+1>/24: traffic to other
  nodes. Addresses are in the loopback range only (`route_localnet=1` lets such
  addresses leave through a real device), and the node's `local 127.0.0.0/8`
  route is narrowed to 127.0.0.1 so the other nodes' addresses are reached
  through the veth, not delivered locally. IPv6 is switched off in every
  namespace of the simulation, so no link-local or other address ever appears.

Topology: 2 nodes are one veth pair. More nodes are a star: each node's veth
goes to a bridge (`simhub`) in the simulation's own namespace, a switch with
one port per node.

What the link is: each node's own full-duplex link to the others, like a NIC.
A token-bucket filter (tbf, shaped_link.LinkSpec) on each node's `simlink`
caps what the node sends; in a star another on its hub port caps what it
receives. So in a 2-node all-to-all that moves B bytes each way, both
directions run at the rate at once: B / rate, not the 2B / rate of
shaped_link's one shared loopback. `--latency-ms` delays each packet once, at
the sending node.

Each node runs one command in its namespace, in practice one torchrun agent
(`--nnodes N --node-rank i`, c10d rendezvous on node 0's address, that agent
hosting it); GLOO_SOCKET_IFNAME=simlink makes Gloo advertise the node's veth
address, so a peer on another node is reached through the link and a peer on
the same node through lo. torchrun sets LOCAL_WORLD_SIZE = L per node. When a
node fails, the others are stopped and its exit code is the simulation's.
Needs root, `unshare`, `ip`, `tc` and `sysctl`; without them it says which is
missing and stops.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dlrmtrain.launch import LaunchSpec
from dlrmtrain.testbed.options import add_rate_options, check_rate_options
from dlrmtrain.testbed.shaped_link import LinkSpec, ShapedLinkUnavailable, command_of, exit_status, run_steps

NODE_SUBNET = "127.100.0"
"""Node i's link address is NODE_SUBNET.<i+1> (loopback range only)."""
LINK_DEVICE = "simlink"
"""Each node's end of the link, the same name in every node's namespace."""
HUB_BRIDGE = "simhub"
RDZV_PORT = 29400
"""The c10d rendezvous port on node 0's address (the namespace is private: always free)."""
MAX_NODES = 200
STOP_GRACE_S = 10.0
"""After a node fails: how long the others get to exit on SIGTERM before SIGKILL."""
NODE_ENV = "DLRMTRAIN_SIM_NODE"
LINK_DEVICE_ENV = "DLRMTRAIN_LINK_DEVICE"
"""Set in every node: the device whose transmit counter is this node's traffic to other nodes."""


@dataclass(frozen=True)
class SimNodes:
    """N simulated nodes on this machine and the link between them."""

    nodes: int
    link: LinkSpec | None = None
    """The rate of each node's link to the others; None: unshaped veths."""

    def __post_init__(self) -> None:
        if not 2 <= self.nodes <= MAX_NODES:
            raise ValueError(f"simulated nodes must be 2 to {MAX_NODES}, got {self.nodes}")

    def node_addr(self, node: int) -> str:
        return f"{NODE_SUBNET}.{node + 1}"

    @property
    def rdzv_endpoint(self) -> str:
        return f"{self.node_addr(0)}:{RDZV_PORT}"

    @property
    def star(self) -> bool:
        """More than two nodes meet at a bridge; two are one veth pair."""
        return self.nodes > 2

    def describe(self) -> str:
        link = "unshaped" if self.link is None else (
            f"{self.link.gbit:g} Gbit/s each way"
            + (f", +{self.link.latency_ms:g} ms per packet" if self.link.latency_ms else ""))
        shape = "a star of veths at a bridge" if self.star else "one veth pair"
        return f"{self.nodes} simulated nodes, joined by {shape} ({link})"

    def setup_steps(self) -> list[list[str]]:
        """The ip / tc / sysctl commands that build the nodes and links (run inside the
        simulation's own namespace, after /run is private)."""
        no_ipv6 = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
        steps: list[list[str]] = [["sysctl", "-q", "-e", "-w", *no_ipv6]]
        if self.star:
            steps += [["ip", "link", "add", "name", HUB_BRIDGE, "type", "bridge"],
                      ["ip", "link", "set", HUB_BRIDGE, "up"]]
        for i in range(self.nodes):
            ns = node_netns(i)
            steps += [
                ["ip", "netns", "add", ns],
                ["ip", "netns", "exec", ns, "sysctl", "-q", "-e", "-w", *no_ipv6,
                 "net.ipv4.conf.all.route_localnet=1"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],
                # Only 127.0.0.1 stays local: the other nodes' 127.100.0.x go out the link.
                ["ip", "-n", ns, "route", "del", "local", "127.0.0.0/8", "dev", "lo",
                 "table", "local"],
            ]
        if self.star:
            for i in range(self.nodes):
                port = f"hub{i}"
                steps += [["ip", "link", "add", "name", LINK_DEVICE, "netns", node_netns(i),
                           "type", "veth", "peer", "name", port],
                          ["ip", "link", "set", port, "master", HUB_BRIDGE],
                          ["ip", "link", "set", port, "up"]]
                if self.link:  # what node i receives
                    steps += self.link.tc_commands(port, delay=False)
        else:
            steps.append(["ip", "link", "add", "name", LINK_DEVICE, "netns", node_netns(0),
                          "type", "veth", "peer", "name", LINK_DEVICE, "netns", node_netns(1)])
        for i in range(self.nodes):
            ns = node_netns(i)
            steps += [["ip", "-n", ns, "addr", "add", f"{self.node_addr(i)}/24",
                       "dev", LINK_DEVICE],
                      ["ip", "-n", ns, "link", "set", LINK_DEVICE, "up"]]
            if self.link:  # what node i sends
                steps += self.link.tc_commands(LINK_DEVICE, netns=ns)
        return steps

    def node_env(self, node: int) -> dict[str, str]:
        """What each node's command finds in its environment (beyond the caller's)."""
        return {"GLOO_SOCKET_IFNAME": LINK_DEVICE, NODE_ENV: str(node),
                LINK_DEVICE_ENV: LINK_DEVICE}

    def inside_args(self) -> list[str]:
        """This module's flags that rebuild `self` inside the private namespace."""
        args = ["--nodes", str(self.nodes)]
        if self.link:
            args += ["--gbit", repr(self.link.gbit), "--latency-ms", repr(self.link.latency_ms)]
        return args


def node_netns(node: int) -> str:
    return f"node{node}"


def unavailable_reason(nodes: int = 2) -> str | None:
    """Why simulated nodes cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "simulated nodes need root (unshare --net --mount, ip netns, tc)"
    for tool in ("unshare", "ip", "tc", "sysctl"):
        if shutil.which(tool) is None:
            return f"simulated nodes need `{tool}`, which is not on PATH"
    probe = "ip link add name simprobe0 type veth peer name simprobe1"
    if nodes > 2:
        probe += f" && ip link add name {HUB_BRIDGE} type bridge"
    done = subprocess.run(["unshare", "--net", "--mount", "sh", "-c", probe],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return (f"`unshare --net --mount sh -c '{probe}'` failed here: "
                f"{done.stderr.strip() or done.returncode}")
    return None


def require_available(nodes: int = 2) -> None:
    reason = unavailable_reason(nodes)
    if reason:
        raise ShapedLinkUnavailable(reason)


def wrap_node_commands(node_cmds: list[list[str]], sim: SimNodes) -> list[str]:
    """The one command line that builds `sim` and runs node i's command in node i."""
    if len(node_cmds) != sim.nodes:
        raise ValueError(f"{sim.nodes} simulated nodes need {sim.nodes} commands, "
                         f"got {len(node_cmds)}")
    require_available(sim.nodes)
    return ["unshare", "--net", "--mount", "--propagation", "private", "--",
            sys.executable, "-m", "dlrmtrain.testbed.sim_nodes", "--inside",
            *sim.inside_args(), "--node-commands", json.dumps(node_cmds)]


def node_launch_specs(spec: LaunchSpec, sim: SimNodes) -> list[LaunchSpec]:
    """One torchrun agent per node: `spec.nproc` ranks each, rendezvous on node 0."""
    if spec.nnodes != 1:
        raise ValueError("simulated nodes run every node here: leave out --nnodes")
    return [replace(spec, nnodes=sim.nodes, node_rank=i, rdzv=sim.rdzv_endpoint,
                    rdzv_id=spec.rdzv_id or "dlrmtrain-sim", local_addr=sim.node_addr(i),
                    rdzv_is_host=i == 0) for i in range(sim.nodes)]


def torchrun_commands(spec: LaunchSpec, sim: SimNodes) -> list[list[str]]:
    """Each node's torchrun agent, run by dlrmtrain's launcher (launch.py): stopped by a
    signal it ends quietly, as the ranks said where they stopped (bare torchrun prints a
    SignalException traceback)."""
    return [[sys.executable, "-m", "dlrmtrain.testbed.sim_nodes", "--agent", json.dumps(asdict(s))]
            for s in node_launch_specs(spec, sim)]


def launch_nodes(spec: LaunchSpec, sim: SimNodes) -> int:
    """Run `spec` (ranks per node, program) on every simulated node; the exit status."""
    from dlrmtrain.launch import default_omp_threads

    threads = spec.omp_threads or default_omp_threads(spec.nproc * sim.nodes)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
    return subprocess.call(wrap_node_commands(torchrun_commands(spec, sim), sim), env=env,
                           preexec_fn=_dies_with_this_process())  # stops the nodes with us


# ---- inside the private namespace ----

def build(sim: SimNodes) -> None:
    """Make /run private (ip netns names live there), then the nodes and links."""
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=755", "dlrmtrain-sim",
                           "/run"], capture_output=True, text=True)
    if done.returncode != 0:
        raise ShapedLinkUnavailable(f"cannot mount a private /run: {done.stderr.strip()}")
    run_steps(sim.setup_steps())
    name_nodes(sim)


def name_nodes(sim: SimNodes) -> None:
    """Name the nodes' addresses in a private /etc/hosts (this mount namespace only).
    c10d's store looks up each client's name, in the IPv4-mapped form too; unanswered,
    the lookup falls through to DNS, which is unreachable here, and c10d warns once
    per connection. Cosmetic: skipped when the bind mount cannot be made."""
    names = {"127.0.0.1": "localhost",
             **{sim.node_addr(i): f"sim-{node_netns(i)}" for i in range(sim.nodes)}}
    try:
        original = Path("/etc/hosts").read_text().rstrip("\n") + "\n"
    except OSError:
        original = ""
    hosts = Path("/run/dlrmtrain-sim-hosts")
    hosts.write_text(original + "".join(f"{addr} {name}\n::ffff:{addr} {name}\n"
                                        for addr, name in names.items()))
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], capture_output=True)


def _die_with_parent(parent: int | None = None) -> None:
    """In a child, before it runs its command: SIGTERM when the process that started it
    (`parent`, by default this one's parent at fork) dies, so no node outlives it, even
    when that process died between the fork and this call."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _dies_with_this_process():
    """preexec_fn for a child that must not outlive this process."""
    return functools.partial(_die_with_parent, os.getpid())


def run_nodes(sim: SimNodes, node_cmds: list[list[str]]) -> int:
    """Start every node's command in its namespace, each in a process group of its own;
    wait for all. When one fails, stop the others and return its exit code. Whatever
    is left in a node's group at the end is killed: nothing outlives the simulation."""
    procs = {}
    for i, cmd in enumerate(node_cmds):
        proc = subprocess.Popen(["ip", "netns", "exec", node_netns(i), *cmd],
                                env={**os.environ, **sim.node_env(i)},
                                preexec_fn=_dies_with_this_process(), start_new_session=True)
        procs[proc.pid] = (i, proc)

    def signal_nodes(sig: int) -> None:
        for pid in procs:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass

    def stop_all(*_) -> None:
        signal_nodes(signal.SIGTERM)
        killer = threading.Timer(STOP_GRACE_S, signal_nodes, args=(signal.SIGKILL,))
        killer.daemon = True
        killer.start()

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    status = 0
    pending = dict(procs)
    while pending:
        pid, wait_status = os.wait()
        if pid not in pending:
            continue
        node, proc = pending.pop(pid)
        proc.returncode = code = os.waitstatus_to_exitcode(wait_status)
        if code != 0 and status == 0:
            status = code if code > 0 else 128 - code
            how = f"exit code {code}" if code > 0 else f"signal {-code}"
            if pending:
                print(f"sim_nodes: node {node} failed ({how}); stopping the other nodes",
                      file=sys.stderr, flush=True)
                stop_all()
    signal_nodes(signal.SIGKILL)
    return status


# ---- probes: is only the traffic between nodes shaped? ----

def tcp_probe_node(node: int, nodes: int, nbytes: int, port: int = 29500) -> None:
    """Node `node` of a ring: time `nbytes` to itself over its own address (inside the
    node: lo) and to the next node (through the link), while receiving from the previous
    one. Prints one line each."""
    own = f"{NODE_SUBNET}.{node + 1}"
    nxt = f"{NODE_SUBNET}.{(node + 1) % nodes + 1}"
    server = socket.create_server((own, port), backlog=4)
    receiver = threading.Thread(target=_serve, args=(server, 2), daemon=True)
    receiver.start()
    inside = _timed_send((own, port), nbytes)
    between = _timed_send((nxt, port), nbytes)
    receiver.join(timeout=600)
    print(f"node {node}: inside the node {nbytes} bytes in {inside:.3f} s; "
          f"to node {(node + 1) % nodes} {nbytes} bytes in {between:.3f} s", flush=True)


def _serve(server: socket.socket, connections: int) -> None:
    """Take `connections` transfers at once (one from inside the node must not wait
    behind one through the link); acknowledge each once all its bytes arrived."""
    def receive(conn: socket.socket) -> None:
        with conn:
            left = int.from_bytes(_recv_exactly(conn, 8), "big")
            while left:
                chunk = conn.recv(min(left, 1 << 20))
                if not chunk:
                    raise ConnectionError("peer closed early")
                left -= len(chunk)
            conn.sendall(b"k")

    receivers = []
    for _ in range(connections):
        receivers.append(threading.Thread(target=receive, args=(server.accept()[0],)))
        receivers[-1].start()
    for r in receivers:
        r.join()


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed early")
        data += chunk
    return data


def _timed_send(addr: tuple[str, int], nbytes: int, connect_timeout_s: float = 60.0) -> float:
    """Seconds from the first byte sent until the receiver acknowledged the last."""
    deadline = time.monotonic() + connect_timeout_s
    while True:  # the peer node may not be listening yet
        try:
            conn = socket.create_connection(addr, timeout=600)
            break
        except (ConnectionRefusedError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = b"x" * (1 << 20)
    with conn:
        t0 = time.perf_counter()
        conn.sendall(nbytes.to_bytes(8, "big"))
        for start in range(0, nbytes, len(chunk)):
            conn.sendall(chunk[:min(len(chunk), nbytes - start)])
        _recv_exactly(conn, 1)
        return time.perf_counter() - t0


def gloo_probe_rank(nbytes: int) -> None:
    """One rank under torchrun: `nbytes` from rank 0 to a rank of its own node, then to
    a rank of another node, each timed between barriers; rank 0 prints both."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    if world // local < 2:
        raise SystemExit("the gloo probe needs at least 2 nodes")
    nodes = [None] * world
    dist.all_gather_object(nodes, int(os.environ.get(NODE_ENV, "0")))
    if nodes != [r // local for r in range(world)]:
        raise SystemExit(f"ranks are not grouped by node: node of each rank {nodes}")
    payload = torch.ones(nbytes // 4, dtype=torch.float32)

    def send(src: int, dst: int) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        if rank == src:
            dist.send(payload, dst)
        elif rank == dst:
            dist.recv(payload, src)
        dist.barrier()
        return time.perf_counter() - t0

    warm = torch.ones(1 << 18, dtype=torch.float32)
    for peer in (1, local) if local > 1 else (local,):  # first use of each pair, untimed
        if rank in (0, peer):
            dist.send(warm, peer) if rank == 0 else dist.recv(warm, 0)
    inside = send(0, 1) if local > 1 else None
    between = send(0, local)
    if rank == 0:
        mb = nbytes / 1e6
        first = f"inside a node {inside:.3f} s, " if inside is not None else ""
        print(f"gloo probe, {world} ranks on {world // local} nodes (LOCAL_WORLD_SIZE={local}): "
              f"{mb:g} MB {first}between nodes {between:.3f} s "
              f"= {nbytes * 8 / between / 1e9:.3f} Gbit/s", flush=True)
    dist.destroy_process_group()


def expand(template: list[str], sim: SimNodes, node: int) -> list[str]:
    """Node `node`'s copy of a command: {node_rank}, {nnodes}, {node_addr} and
    {rdzv_endpoint} replaced."""
    values = {"{node_rank}": str(node), "{nnodes}": str(sim.nodes),
              "{node_addr}": sim.node_addr(node), "{rdzv_endpoint}": sim.rdzv_endpoint}
    out = []
    for token in template:
        for key, value in values.items():
            token = token.replace(key, value)
        out.append(token)
    return out


def _on_the_nodes(p: argparse.ArgumentParser, args: argparse.Namespace, cmd: list[str]) -> int:
    """A command (or a probe) on every simulated node, the nodes built first where not yet."""
    try:
        check_rate_options(args.gbit, args.latency_ms)
    except ValueError as e:
        p.error(str(e))
    link = None if args.gbit is None else LinkSpec(args.gbit, args.latency_ms)
    sim = SimNodes(args.nodes, link)
    if args.tcp_probe_node is not None:
        tcp_probe_node(args.tcp_probe_node, sim.nodes, int(args.tcp_probe_mb * 1e6))
        return 0
    if args.inside:
        build(sim)
        return run_nodes(sim, json.loads(args.node_commands))
    if args.probe_mb is not None:
        spec = LaunchSpec(nproc=args.nproc, module="dlrmtrain.testbed.sim_nodes",
                          args=["--gloo-probe-bytes", str(int(args.probe_mb * 1e6))])
        print(f"sim_nodes: {sim.describe()}, {args.nproc} ranks each", flush=True)
        return launch_nodes(spec, sim)
    if args.tcp_probe_mb is not None:
        cmd = [sys.executable, "-m", "dlrmtrain.testbed.sim_nodes", *sim.inside_args(),
               "--tcp-probe-mb", repr(args.tcp_probe_mb), "--tcp-probe-node", "{node_rank}"]
    if not cmd:
        p.error("no command given after -- (or --probe-mb / --tcp-probe-mb)")
    node_cmds = [expand(cmd, sim, i) for i in range(sim.nodes)]
    return subprocess.run(wrap_node_commands(node_cmds, sim)).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2, help="simulated nodes (default: 2)")
    add_rate_options(p, "each node's link rate, Gbit/s, each way (default: unshaped)")
    p.add_argument("--probe-mb", type=float, default=None,
                   help="instead of a command: time a Gloo transfer of this many MB inside a "
                        "node and between nodes (torchrun, --nproc ranks per node), then a TCP one")
    p.add_argument("--nproc", type=int, default=2,
                   help="ranks per node for --probe-mb (default: 2)")
    p.add_argument("--tcp-probe-mb", type=float, default=None,
                   help="instead of a command: time a TCP transfer of this many MB inside "
                        "each node and to the next node (no torch)")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--node-commands", default=None, help=argparse.SUPPRESS)
    p.add_argument("--tcp-probe-node", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--gloo-probe-bytes", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--agent", default=None, help=argparse.SUPPRESS)  # a node's LaunchSpec, JSON
    p.add_argument("cmd", nargs=argparse.REMAINDER,
                   help="-- command each node runs; {node_rank}, {nnodes}, {node_addr} and "
                        "{rdzv_endpoint} are replaced per node")
    args = p.parse_args(argv)
    if args.gloo_probe_bytes is not None:  # one rank of the probe, already in its node
        gloo_probe_rank(args.gloo_probe_bytes)
        return 0
    if args.agent is not None:  # one node's torchrun agent, already in its node
        from dlrmtrain.launch import launch

        return launch(LaunchSpec(**json.loads(args.agent)))
    return exit_status("sim_nodes", lambda: _on_the_nodes(p, args, command_of(args)))


if __name__ == "__main__":
    sys.exit(main())
