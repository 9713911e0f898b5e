"""The shaped link really limits bandwidth: a bounded transfer through it takes at
least (bytes - one bucket) / rate. Skips, with the reason, where it cannot be made."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dlrmtrain.testbed.shaped_link import LinkSpec, unavailable_reason, wrap_command

REASON = unavailable_reason()
needs_link = pytest.mark.skipif(REASON is not None, reason=str(REASON))

# Two Gloo ranks exchange `n` bytes each way with one all_to_all_single.
GLOO_PROBE = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    def rank_main(rank, n, port, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=2)
        x = torch.ones(2 * n // 4, dtype=torch.float32)
        y = torch.empty_like(x)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_to_all_single(y, x)
        dist.barrier()
        out[rank] = time.perf_counter() - t0
        dist.destroy_process_group()
    if __name__ == "__main__":
        n, port = int(sys.argv[1]), int(sys.argv[2])
        out = mp.Manager().dict()
        mp.spawn(rank_main, args=(n, port, out), nprocs=2)
        print(2 * n, max(out.values()))
""")


def run_behind(link: LinkSpec | None, script: str, *args: str, tmp_path) -> tuple[int, float]:
    path = tmp_path / "probe.py"
    path.write_text(script)
    done = subprocess.run(wrap_command([sys.executable, str(path), *args], link),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    moved, seconds = done.stdout.split()[-2:]
    return int(moved), float(seconds)


@needs_link
def test_tcp_probe_takes_at_least_bytes_over_rate():
    """The launcher's own probe: one TCP connection on 127.0.0.1 behind the link."""
    link = LinkSpec(gbit=0.2)
    n = 10_000_000  # 0.4 s at 0.2 Gbit/s
    done = subprocess.run([sys.executable, "-m", "dlrmtrain.testbed.shaped_link",
                           "--gbit", "0.2", "--probe-mb", "10"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    moved, _, _, seconds = done.stdout.split()[:4]
    assert int(moved) == n
    assert float(seconds) >= (n - link.burst_bytes()) / link.bytes_per_s


@needs_link
def test_gloo_all_to_all_takes_at_least_bytes_over_rate(tmp_path):
    """Both ranks' sends cross the one shared link: 2n bytes in all."""
    link = LinkSpec(gbit=0.2)
    n = 4_000_000
    moved, seconds = run_behind(link, GLOO_PROBE, str(n), "29631", tmp_path=tmp_path)
    assert moved == 2 * n
    assert seconds >= (2 * n - link.burst_bytes()) / link.bytes_per_s


def test_link_spec_rejects_nonsense_and_sizes_the_bucket():
    with pytest.raises(ValueError, match="> 0 Gbit/s"):
        LinkSpec(gbit=0)
    with pytest.raises(ValueError, match="latency"):
        LinkSpec(gbit=1, latency_ms=-1)
    # The bucket always holds two maximal loopback packets (64 KiB with GSO).
    assert LinkSpec(gbit=0.5).burst_bytes() == 2 * 65536
    assert LinkSpec(gbit=10).burst_bytes() == int(10e9 / 8 * 0.0005)
    assert wrap_command(["true"], None) == ["true"]


def test_tc_commands_shape_any_device_and_delay_only_where_asked():
    link = LinkSpec(gbit=1, latency_ms=2)
    on_lo = link.tc_commands()
    assert [c[:5] for c in on_lo] == [["tc", "qdisc", "add", "dev", "lo"]] * 2
    assert "netem" in on_lo[0] and "tbf" in on_lo[1]  # delay above the bucket
    in_node = link.tc_commands("simlink", netns="node0", delay=False)
    assert len(in_node) == 1 and in_node[0][:7] == ["tc", "-n", "node0", "qdisc", "add", "dev",
                                                    "simlink"]
    assert "tbf" in in_node[0] and "netem" not in in_node[0]


@pytest.mark.parametrize("module", ["shaped_link", "sim_nodes"])
def test_the_old_command_still_runs_and_says_where_it_went(module):
    done = subprocess.run([sys.executable, "-m", f"dlrmtrain.distributed.{module}", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"running python -m dlrmtrain.testbed.{module}" in done.stderr
    assert "--gbit" in done.stdout  # the testbed's own command line answered
