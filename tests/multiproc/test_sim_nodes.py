"""Simulated nodes: only traffic between nodes crosses the shaped link, and a training
run spans the nodes. Skips, with the reason, where the namespaces cannot be made."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlrmtrain.testbed.shaped_link import LinkSpec
from dlrmtrain.testbed.sim_nodes import SimNodes, node_launch_specs, unavailable_reason
from dlrmtrain.launch import LaunchSpec, torchrun_argv
from tests.common import tiny_overrides

REPO = Path(__file__).resolve().parents[2]
REASON = unavailable_reason(nodes=3)  # a star of 3 nodes needs a bridge too
needs_sim = pytest.mark.skipif(REASON is not None, reason=str(REASON))
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def sim_nodes(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dlrmtrain.testbed.sim_nodes", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def ipv4_tokens(argvs: list[list[str]]) -> set[str]:
    return {m for argv in argvs for token in argv
            for m in re.findall(r"\d+\.\d+\.\d+\.\d+", token)}


def test_nodes_meet_at_node_zero_and_use_loopback_addresses_only():
    sim = SimNodes(3, LinkSpec(gbit=1, latency_ms=2))
    specs = node_launch_specs(LaunchSpec(nproc=2, args=["--config", "c.yaml"]), sim)
    assert [s.node_rank for s in specs] == [0, 1, 2]
    assert [s.local_addr for s in specs] == ["127.100.0.1", "127.100.0.2", "127.100.0.3"]
    assert [s.rdzv_is_host for s in specs] == [True, False, False]  # node 0 hosts the store
    argv = torchrun_argv(specs[2])
    assert {"--nproc-per-node=2", "--nnodes=3", "--node-rank=2", "--local-addr=127.100.0.3",
            "--rdzv-endpoint=127.100.0.1:29400", "--rdzv-conf=is_host=0"} <= set(argv)
    steps = sim.setup_steps()
    addresses = ipv4_tokens([*steps, *(torchrun_argv(s) for s in specs)])
    assert addresses and all(ipaddress.ip_address(a) in LOOPBACK for a in addresses)
    # Each packet is delayed once, at the sending node; the hub ports only shape.
    delayed = [s for s in steps if "netem" in s]
    assert len(delayed) == 3 and all(s[s.index("-n") + 1].startswith("node") for s in delayed)
    assert sum("tbf" in s for s in steps) == 6  # each node's send and receive side
    assert not any("bridge" in s for s in SimNodes(2, LinkSpec(1)).setup_steps())  # one pair
    with pytest.raises(ValueError, match="2 to"):
        SimNodes(1)
    with pytest.raises(ValueError, match="--nnodes"):
        node_launch_specs(LaunchSpec(nnodes=2, rdzv="127.0.0.1:1"), sim)
    # A script instead of a module (bench_train.py runs itself on every rank).
    assert torchrun_argv(LaunchSpec(script="bench.py", args=["--x"]))[-2:] == ["bench.py", "--x"]


@pytest.mark.parametrize("args, message", [
    (["--sim-nodes", "1"], "--sim-nodes: simulated nodes must be 2"),
    (["--sim-nodes", "2", "--nnodes", "2", "--rdzv", "127.0.0.1:1"], "leave out --nnodes"),
])
def test_impossible_sim_node_options_exit_2(args, message, capsys):
    from dlrmtrain.cli import main

    assert main(["train", "--config", "configs/quickstart.yaml", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_delay_without_a_rate_is_refused_not_dropped():
    proc = sim_nodes("--latency-ms", "5", "--", "true", timeout=30)
    assert proc.returncode == 2 and "--latency-ms needs --gbit" in proc.stderr, proc.stderr


@needs_sim
@pytest.mark.parametrize("nodes", [2, 3])
def test_only_traffic_between_nodes_is_shaped(nodes):
    """Each node sends 25 MB to itself (lo) and to the next node (the link) at once:
    the second takes at least (bytes - one bucket) / rate, the first far less
    (25 MB at 0.2 Gbit/s is 1 s; unshaped loopback moves it in tens of ms)."""
    link, mb = LinkSpec(gbit=0.2), 25
    done = sim_nodes("--nodes", str(nodes), "--gbit", "0.2", "--tcp-probe-mb", str(mb))
    assert done.returncode == 0, done.stderr
    lines = re.findall(r"node (\d+): inside the node (\d+) bytes in ([\d.]+) s; "
                       r"to node (\d+) (\d+) bytes in ([\d.]+) s", done.stdout)
    assert sorted(int(line[0]) for line in lines) == list(range(nodes)), done.stdout
    n = int(mb * 1e6)
    shaped_at_least = (n - link.burst_bytes()) / link.bytes_per_s
    for node, moved_in, inside, to, moved_out, between in lines:
        assert int(moved_in) == int(moved_out) == n
        assert int(to) == (int(node) + 1) % nodes
        assert float(between) >= shaped_at_least, done.stdout
        assert float(inside) < 0.5 * n / link.bytes_per_s, done.stdout


@needs_sim
def test_failing_node_stops_the_others_and_gives_its_exit_code():
    """Node 1 fails after a second; node 0's shell would wait a minute on `sleep`, a
    child that outlives the shell unless the node's whole process group is stopped
    (it holds the output open). Every node sees only loopback-range addresses and
    its link as Gloo's interface."""
    script = ("ip -o addr; echo iface=$GLOO_SOCKET_IFNAME node=$DLRMTRAIN_SIM_NODE; "
              "if [ {node_rank} = 1 ]; then sleep 1; exit 3; fi; sleep 60")
    done = sim_nodes("--nodes", "2", "--", "sh", "-c", script, timeout=40)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "node 1 failed (exit code 3)" in done.stderr
    assert "iface=simlink node=1" in done.stdout
    addresses = re.findall(r"\binet6?\s+(\S+)/", done.stdout)
    assert set(addresses) >= {"127.0.0.1", "127.100.0.2"}
    assert all(ipaddress.ip_address(a) in LOOPBACK for a in addresses)  # no IPv6 at all


@needs_sim
def test_training_runs_across_two_simulated_nodes(tmp_path):
    overrides = tiny_overrides(str(tmp_path), "run.max_steps=2", "eval.enabled=false",
                               "run.name=sim", "comm.codec=dedup", "comm.dedup_at=owner")
    done = subprocess.run([sys.executable, "-m", "dlrmtrain", "train", "--config",
                           "configs/quickstart.yaml", "--sim-nodes", "2", "--nproc", "1",
                           "--link-gbit", "1", *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 ranks on 2 nodes" in done.stdout
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2


def test_mlperf_runs_span_the_simulated_nodes(tmp_path):
    """Each run is `dlrmtrain train --sim-nodes` (which builds the nodes), the system
    name counts nodes x ranks; where nodes cannot be made the runner says why up front."""
    from dlrmtrain.config.loader import dump_config
    from dlrmtrain.mlperf_runner import parse_args, plan_from_args, run_command
    from tests.common import tiny_config
    from tests.mlperf.test_trainer_mlperf_log import MLPERF_SHAPE, RUN

    config = tmp_path / "tiny.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *MLPERF_SHAPE, *RUN), config)
    args = parse_args(["--config", str(config), "--out", str(tmp_path / "out"), "--nproc", "1",
                       "--sim-nodes", "2", "--link-gbit", "1"])
    if unavailable_reason(2):
        with pytest.raises(SystemExit, match="--sim-nodes: "):
            plan_from_args(args)
        return
    plan = plan_from_args(args)
    cmd = run_command(plan, "dedup", 0)
    assert cmd[1:4] == ["-m", "dlrmtrain", "train"]  # not wrapped: train builds the nodes
    assert {"--nproc=1", "--sim-nodes=2", "--link-gbit=1.0"} <= set(cmd)
    assert plan.system("dedup") == "cpu2x1_gloo_link-1gbit_codec-dedup"
    with pytest.raises(SystemExit, match="--sim-nodes: simulated nodes must be 2"):
        plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "o2"),
                                   "--sim-nodes", "1"]))
