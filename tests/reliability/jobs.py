"""Start `torchrun -m dlrmtrain.train` as a real job and inject faults into it.

A test can always end a job and every process it started (`kill_job`); every
wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests.common import tiny_overrides

REPO = Path(__file__).resolve().parents[2]


def start_job(out_dir: Path, *overrides: str, nproc: int = 2, module: str = "dlrmtrain.train",
              launcher: bool = False) -> subprocess.Popen:
    """torchrun of `module` with the tiny config and `overrides` (`launcher`: `module`
    starts its ranks itself, through dlrmtrain's launcher; leading overrides may be its own
    arguments)."""
    torchrun = [] if launcher else ["-m", "torch.distributed.run", "--standalone",
                                    f"--nproc_per_node={nproc}"]
    own = [o for o in overrides if "=" not in o]
    cmd = [sys.executable, *torchrun, "-m", module, *own,
           *tiny_overrides(str(out_dir), *overrides[len(own):])]
    log = open(out_dir / f"job-{time.monotonic_ns()}.out", "w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                            start_new_session=True)


def start_cli_job(out_dir: Path, *overrides: str, nproc: int = 2,
                  log_name: str | None = None) -> subprocess.Popen:
    """`dlrmtrain train --nproc N` as a user starts it (the launcher runs torchrun in-process)."""
    cmd = [sys.executable, "-m", "dlrmtrain", "train", "--config", "configs/quickstart.yaml",
           f"--nproc={nproc}", *tiny_overrides(str(out_dir), *overrides)]
    log = open(out_dir / (log_name or f"job-{time.monotonic_ns()}.out"), "w")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                            start_new_session=True)


def output_of(out_dir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(out_dir.glob("job-*.out")))


def finish(job: subprocess.Popen, timeout: float) -> tuple[int, float]:
    """Wait for the job to end; (exit code, seconds waited). Kills it past `timeout`."""
    start = time.monotonic()
    try:
        rc = job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(job)
        raise AssertionError(f"job did not end within {timeout:.0f}s")
    return rc, time.monotonic() - start


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (torchrun starts its workers in their own sessions,
    so a process group does not reach them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_job(job: subprocess.Popen) -> None:
    """End the job and every process it started (even stopped ones)."""
    if job.poll() is not None:  # ended: its pid may already belong to another process
        return
    for pid in [job.pid, *_descendants(job.pid)]:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    job.wait(timeout=30)


def worker_pid(job: subprocess.Popen, rank: int) -> int:
    """The pid of the job's worker with RANK=`rank`."""
    for pid in _descendants(job.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and f"LOCAL_RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no worker with rank {rank} in job {job.pid}")


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_until(condition: Callable[[], bool], timeout: float, job: subprocess.Popen,
               poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if job.poll() is not None:
            raise AssertionError(f"job ended early with exit code {job.returncode}")
        if time.monotonic() > deadline:
            kill_job(job)
            raise AssertionError(f"condition not met within {timeout:.0f}s")
        time.sleep(poll_s)


def mlperf_keys(run_dir: Path) -> list[str]:
    return [json.loads(line.split(":::MLLOG ", 1)[1])["key"]
            for line in (run_dir / "mlperf.log").read_text().splitlines() if ":::MLLOG " in line]


def named(out: str, lost: int) -> str:
    """The one error line of a job whose rank `lost` died by SIGKILL (no traceback)."""
    assert "Traceback" not in out, out[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("error: ")]
    assert line.startswith(f"error: rank {lost} (its process is gone) was lost at step "), line
    assert "the connection to it closed (Gloo: " in line and "last checkpoint " in line, line
    assert f"dlrmtrain: rank {lost} was killed by SIGKILL" in out, out[-3000:]
    return line


def named_and_recorded(out: str, run_dir: Path, lost: int) -> str:
    """`named`'s line, the same as the run's last record, a `stopped` one."""
    line = named(out, lost)
    last = metrics(run_dir)[-1]
    assert last["kind"] == "stopped" and last["reason"] == line.removeprefix("error: "), last
    return line
