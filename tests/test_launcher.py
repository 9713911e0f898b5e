"""The `dlrmtrain` launcher as a user runs it: real processes, real torchrun, real Gloo."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrmtrain.launch import LaunchSpec, torchrun_argv
from tests.common import tiny_overrides

REPO = Path(__file__).resolve().parents[1]


def dlrmtrain(*args: str, timeout: float = 180, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m dlrmtrain ARGS` from the repository root, under a timeout."""
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run([sys.executable, "-m", "dlrmtrain", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_config_error_is_one_line_and_exit_2_before_any_rank_starts(tmp_path):
    started = time.perf_counter()
    proc = dlrmtrain("train", "--config", "configs/quickstart.yaml", "--nproc", "2",
                     f"run.output_dir={tmp_path}", "optim.lr=fast")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "config error: override 'optim.lr=fast': optim.lr: expected a number, got 'fast'"]
    assert not any(tmp_path.iterdir())        # no rank ran, nothing was written
    assert time.perf_counter() - started < 60  # no rendezvous was waited for


def test_cross_check_uses_the_launch_world_size(tmp_path):
    # 2050 divides by 2 ranks on one node but not by 4 ranks on 2 nodes.
    ok = ["--config", "configs/quickstart.yaml", f"run.output_dir={tmp_path}",
          "run.global_batch_size=2050"]
    proc = dlrmtrain("train", *ok, "--nproc", "2", "--nnodes", "2", "--rdzv", "127.0.0.1:1")
    assert proc.returncode == 2
    assert "run.global_batch_size" in proc.stderr and "4" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--nnodes", "2"], "--rdzv HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv", "127.0.0.1:1"], "--node-rank 2"),
    (["--nproc", "0"], "--nproc"),
])
def test_impossible_launch_options_exit_2(args, message):
    proc = dlrmtrain("train", "--config", "configs/quickstart.yaml", *args)
    assert proc.returncode == 2 and message in proc.stderr


def test_unknown_subcommand_exits_2():
    proc = dlrmtrain("fly")
    assert proc.returncode == 2 and "train, preprocess, preprocess-yambda, mlperf, report" in proc.stderr


def test_torchrun_arguments_single_and_multi_node():
    one = torchrun_argv(LaunchSpec(nproc=2, args=["--config", "c.yaml"]))
    assert "--standalone" in one and one[-4:] == ["-m", "dlrmtrain.train", "--config", "c.yaml"]
    many = torchrun_argv(LaunchSpec(nproc=4, nnodes=2, node_rank=1, rdzv="10.0.0.5:29400",
                                    rdzv_id="job7"))
    assert "--standalone" not in many
    assert {"--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d",
            "--rdzv-endpoint=10.0.0.5:29400", "--rdzv-id=job7"} <= set(many)
    assert not any(a.startswith("--local-addr") for a in many)  # a real network: torchrun picks
    local = torchrun_argv(LaunchSpec(nproc=1, nnodes=2, rdzv="127.0.0.1:29400"))
    assert "--local-addr=127.0.0.1" in local


def test_two_rank_run_is_quiet_and_writes_the_run_directory(tmp_path):
    """The quick start's console: before, 26 lines of plan and 26 of per-table bytes
    (a `distinct` of 1.000 for a codec that never counted it); now about 26 lines in
    all (25, and the comm summary's "ids sent, rows looked up, rows sent" line; 27 with the line
    saying why an unset comm.dedup_at stays at the owner), the full tables in plan.txt and
    comm_stats.json."""
    proc = dlrmtrain("train", "--config", "configs/quickstart.yaml", "--nproc", "2",
                     f"run.output_dir={tmp_path}", "run.max_steps=3", "eval.evals_per_epoch=1",
                     "data.synthetic.num_train_samples=16384", "data.synthetic.num_eval_samples=4096",
                     "run.name=launched", "comm.codec=dedup", "comm.table_codecs={t_cat_3: none}",
                     "comm.dedup_at=null")  # unset (the quick start's config says owner)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("dlrmtrain: building launched: dlrm_v1, 26 tables")
    # comm.dedup_at unset: the quick start's Adagrad keeps dedup at the owner, said once (issue 33)
    assert proc.stderr.count("comm.dedup_at: owner (optim.name: adagrad: fbgemm's variable-batch "
                             "TBE refuses EXACT_ADAGRAD)\n") == 1, proc.stderr
    assert "  codec            dedup (t_cat_3: none)\n" in proc.stdout   # the summary names it
    assert "OMP_NUM_THREADS" not in proc.stderr          # torchrun's banner
    assert "Warning" not in proc.stdout + proc.stderr     # TorchRec's deprecation warnings
    run_dir = tmp_path / "launched"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3
    assert summary["codec"] == "dedup (t_cat_3: none)"
    lines = [line for line in (proc.stdout + proc.stderr).splitlines()
             if line.strip() and not line.startswith("train:")]  # the progress bar
    assert len(lines) <= 27, "\n".join(lines)  # 26, and the comm.dedup_at line above
    assert f"full plan: {run_dir / 'plan.txt'}" in proc.stdout
    assert len((run_dir / "plan.txt").read_text().splitlines()) == 27  # a title + every table
    assert f"per table: {run_dir / 'comm_stats.json'}" in proc.stdout
    [none_row] = [line.split() for line in lines if line.split()[:2] == ["none", "1"]]
    [dedup_row] = [line.split() for line in lines if line.split()[:2] == ["dedup", "25"]]
    assert none_row[2] == "—"                          # codec none counts no distinct bags
    assert 0 < float(dedup_row[2]) < 1                 # dedup does


def test_a_failing_rank_gives_its_exit_code_and_one_line(tmp_path):
    # Passes the launcher's checks, fails inside the ranks: the data directory is empty,
    # a named error (issue 29) printed once, every rank's exit code 2.
    (tmp_path / "empty").mkdir()
    proc = dlrmtrain("train", "--config", "configs/quickstart.yaml", "--nproc", "2",
                     *tiny_overrides(str(tmp_path), "data.source=criteo",
                                     f"data.path={tmp_path / 'empty'}", "data.split=fraction"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'empty'}: no dataset.json, day_*_sparse.npy, day_*_sparse_multi_hot.npz "
        f"or terabyte_processed_*.bin found"]
    assert "ChildFailedError" not in proc.stderr and "Traceback" not in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_train_as_one_node_of_the_same_world_size(tmp_path):
    """Two torchrun agents on this machine as two nodes (c10d rendezvous on 127.0.0.1),
    one rank each, codec dedup: the same losses as one node with two ranks. The one-node
    run goes at the same time (its own standalone store): their start-ups overlap."""
    common = ["--config", "configs/quickstart.yaml",
              *tiny_overrides(str(tmp_path), "run.max_steps=4", "eval.enabled=false",
                              "comm.codec=dedup", "comm.dedup_at=owner")]
    rdzv = f"127.0.0.1:{_free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    commands = {"one node": ["--nproc", "2", *common, "run.name=one_node"],
                **{f"node {r}": ["--nproc", "1", "--nnodes", "2", "--node-rank", str(r),
                                 "--rdzv", rdzv, "--rdzv-id", f"test{rdzv}", *common,
                                 "run.name=two_nodes"] for r in (0, 1)}}
    procs = {name: subprocess.Popen([sys.executable, "-m", "dlrmtrain", "train", *args],
                                    cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for name, args in commands.items()}
    try:
        outputs = {name: p.communicate(timeout=180)[0] for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    assert {name: p.returncode for name, p in procs.items()} == dict.fromkeys(procs, 0), \
        "\n".join(f"--- {name}\n{out}" for name, out in outputs.items())

    def losses(name: str) -> list[float]:
        return [loss for _, loss in
                json.loads((tmp_path / name / "summary.json").read_text())["losses"]]

    assert json.loads((tmp_path / "two_nodes" / "comm_stats.json").read_text())["tables"]
    assert losses("two_nodes") == pytest.approx(losses("one_node"), rel=1e-6)
    assert len(losses("two_nodes")) == 4


def test_link_options_are_dropped_from_the_command_run_behind_the_link():
    from dlrmtrain.testbed.options import without_link_options

    argv = ["--config", "c.yaml", "--link-gbit", "1", "--nproc", "2", "--link-latency-ms=0.5",
            "run.max_steps=2"]
    assert without_link_options(argv) == ["--config", "c.yaml", "--nproc", "2", "run.max_steps=2"]


@pytest.mark.parametrize("args, message", [
    (["--link-gbit", "0"], "link rate must be > 0"),
    (["--link-gbit", "1", "--nnodes", "2", "--rdzv", "127.0.0.1:1"], "one node only"),
    (["--link-latency-ms", "5"], "--link-latency-ms needs --link-gbit"),
    (["--sim-nodes", "2", "--link-latency-ms", "5"], "--link-latency-ms needs --link-gbit"),
])
def test_impossible_link_options_exit_2(args, message):
    proc = dlrmtrain("train", "--config", "configs/quickstart.yaml", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_train_behind_a_shaped_link(tmp_path):
    from dlrmtrain.testbed.shaped_link import unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    proc = dlrmtrain("train", "--config", "configs/quickstart.yaml", "--nproc", "2",
                     "--link-gbit", "1",
                     *tiny_overrides(str(tmp_path), "run.max_steps=2", "eval.enabled=false",
                                     "run.name=linked", "comm.codec=dedup",
                                     "comm.dedup_at=owner"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "linked" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2


def test_a_killed_rank_is_named_when_the_rank_left_ends_in_the_same_poll(monkeypatch, capsys):
    """torchrun reports the failure it saw first; when rank 0 (exit 3, having named the dead
    peer) and the SIGKILLed rank 1 end within one poll, that can be rank 0's. The launcher
    still names the killed rank (the race behind a flaky tests/reliability/test_peer_failures)."""
    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from dlrmtrain import launch

    failures = {0: ProcessFailure(local_rank=0, pid=1, exitcode=3, error_file="/nonexistent"),
                1: ProcessFailure(local_rank=1, pid=2, exitcode=-9, error_file="/nonexistent")}
    failures[1].timestamp = failures[0].timestamp + 1  # rank 0's is the first failure

    def run(_args):
        raise ChildFailedError("train", failures)

    monkeypatch.setattr(torch.distributed.run, "run", run)
    monkeypatch.setattr(launch, "_quiet_agent", lambda: None)
    for name in ("OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL", *launch.RANK_MALLOC):  # launch sets what is unset: keep
        monkeypatch.setenv(name, os.environ.get(name, "1" if name[0] in "OM" else "WARNING"))
    assert launch.launch(LaunchSpec(nproc=2, args=["--config", "c.yaml"])) == 3
    assert "dlrmtrain: rank 1 was killed by SIGKILL" in capsys.readouterr().err


def test_ranks_take_malloc_from_the_heap_unless_the_environment_says(monkeypatch):
    """The ranks get glibc malloc without mmap for large blocks and without trimming (a CPU
    step's tens-of-MB tensors would fault their pages in afresh each step); a value the
    environment sets is kept."""
    import torch.distributed.run

    from dlrmtrain import launch

    seen = {}

    def run(_args):
        seen.update({name: os.environ.get(name) for name in launch.RANK_MALLOC})

    monkeypatch.setattr(torch.distributed.run, "run", run)
    monkeypatch.setattr(launch, "_quiet_agent", lambda: None)
    for name in ("OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL"):
        monkeypatch.setenv(name, os.environ.get(name, "1" if name[0] == "O" else "WARNING"))
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "")  # recorded, so that what launch sets is undone after
    monkeypatch.delenv("MALLOC_MMAP_MAX_")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "12345")  # the user's own
    assert launch.launch(LaunchSpec(nproc=2, args=["--config", "c.yaml"])) == 0
    assert seen == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "12345"}
