"""A run's life under the faults a cluster brings (issue 21): a second run on the same
directory, a full disk, a signal. Real jobs (`dlrmtrain train`, 2 Gloo ranks) where
the fault crosses processes; a world of one in-process where it does not."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.jobs import REPO, finish, kill_job, metrics, start_cli_job, wait_until

START_TIMEOUT = 150


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# ---- one run per directory ---------------------------------------------------------

_HOLD = """
import sys, time
from pathlib import Path
from dlrmtrain.run.lock import RunLock
lock = RunLock(Path(sys.argv[1]))
lock.acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _holder(run_dir: Path, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir), str(seconds)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_lock_names_its_holder_and_a_dead_ones_does_not_block(tmp_path):
    from dlrmtrain.run.errors import SetupError
    from dlrmtrain.run.lock import RunLock

    holder = _holder(tmp_path, 60)
    try:
        with pytest.raises(SetupError) as refused:
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()  # SIGKILL: no cleanup; the kernel drops the lock
        holder.wait(timeout=30)
    message = str(refused.value)
    assert f"{tmp_path} is in use by another run" in message
    assert f"host {socket.gethostname()}, pid {holder.pid}, started 20" in message
    assert (tmp_path / "run.lock").exists()  # the dead holder's file stays ...
    lock = RunLock(tmp_path)
    lock.acquire()  # ... and does not block
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    lock.release()


LONG = ["run.name=x", "run.epochs=1000", "eval.enabled=false", "checkpoint.every_steps=4"]


def _first_to_end(jobs: dict, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, job in jobs.items():
            if job.poll() is not None:
                return name
        time.sleep(0.1)
    raise AssertionError(f"neither run ended within {timeout:.0f}s (both running: not refused)")


def test_two_runs_one_second_apart_one_refused_then_sigterm_ends_the_other(tmp_path):
    """The probe: two runs of one name started one second apart. Before: both ran to exit
    0 over each other's records; SIGTERM to the launcher printed torchrun's
    SignalException traceback. Now the later one to reach the directory is refused,
    naming the holder, and SIGTERM ends the holder with one line and exit 143."""
    run_dir = tmp_path / "x"
    jobs = {}
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            jobs[name] = start_cli_job(tmp_path / name, *LONG, f"run.output_dir={tmp_path}")
            time.sleep(1)
        refused = _first_to_end(jobs, START_TIMEOUT)
        [holder] = [n for n in jobs if n != refused]
        wait_until(lambda: any(r["kind"] == "checkpoint" for r in metrics(run_dir)),
                   START_TIMEOUT, jobs[holder])
        time.sleep(1)  # a few more steps, so the stop lands mid-run
        os.kill(jobs[holder].pid, signal.SIGTERM)
        rc, _ = finish(jobs[holder], 60)
    finally:
        for job in jobs.values():
            kill_job(job)
    out = {n: "\n".join(p.read_text() for p in (tmp_path / n).glob("job-*.out")) for n in jobs}
    # the refused run: exit 2 at start, naming the holder, one line after the banner
    assert jobs[refused].returncode == 2, out[refused]
    pid = json.loads((run_dir / "run.lock").read_text())["pid"]
    assert (f"error: {run_dir} is in use by another run (host {socket.gethostname()}, pid {pid}, "
            f"started 20") in out[refused]
    assert len(_lines(out[refused])) == 2 and "Traceback" not in out[refused]
    # the holder: one line, no traceback, exit 128 + SIGTERM, its records whole
    assert rc == 128 + signal.SIGTERM, out[holder]
    assert "Traceback" not in out[holder] and "death signal" not in out[holder], out[holder]
    [line] = [l for l in _lines(out[holder]) if "interrupted" in l]
    records = metrics(run_dir)
    stopped = records[-1]
    assert stopped["kind"] == "stopped" and stopped["reason"] == line
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == list(range(1, stopped["step"] + 1))  # one run's records, none lost
    last_ckpt = max(r["step"] for r in records if r["kind"] == "checkpoint")
    assert line == f"interrupted by SIGTERM at step {stopped['step']}; last checkpoint step {last_ckpt}"


def test_sigterm_to_one_rank_ends_the_job_with_the_same_one_line(tmp_path):
    """Only rank 1 gets the signal: it stops at a step boundary and leaves its reason in
    the job's store; rank 0, whose collective then fails, ends the same way (no
    traceback from either) and prints the line."""
    from tests.reliability.jobs import worker_pid

    job = start_cli_job(tmp_path, *LONG, "checkpoint.every_steps=0")
    try:
        wait_until(lambda: len(metrics(tmp_path / "x")) > 3, START_TIMEOUT, job)
        os.kill(worker_pid(job, 1), signal.SIGTERM)
        rc, _ = finish(job, 60)
    finally:
        kill_job(job)
    out = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert rc == 128 + signal.SIGTERM, out
    assert "Traceback" not in out, out
    [line] = [l for l in _lines(out) if "interrupted" in l]
    assert line.startswith("interrupted by SIGTERM at step ") and line.endswith("last checkpoint none")
    assert metrics(tmp_path / "x")[-1] == {**metrics(tmp_path / "x")[-1], "kind": "stopped",
                                           "reason": line}


# ---- full disks -------------------------------------------------------------------

def _mount_tmpfs(path: Path, size_kb: int) -> None:
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip() or proc.returncode}")


@pytest.fixture
def small_disk(tmp_path):
    """A folder on its own tiny file system (a tmpfs; needs mount rights)."""
    disk = tmp_path / "disk"

    def mount(size_kb: int) -> Path:
        _mount_tmpfs(disk, size_kb)
        return disk

    yield mount
    if disk.is_dir() and os.path.ismount(disk):
        subprocess.run(["umount", "--lazy", str(disk)], check=False)  # even if a file is open


# tiny tables: one checkpoint of 2 ranks takes about 350 KB; 900 KB hold two, not three
CKPT = ["run.name=d", "eval.enabled=false", "checkpoint.every_steps=2", "checkpoint.keep=2",
        "run.max_steps=12"]


def test_checkpoint_dir_on_a_full_disk_stops_with_one_clear_error(tmp_path, small_disk):
    """Before: torch's `RuntimeError: [enforce fail at inline_container.cc:672] ...
    unexpected pos`, and a step_N.partial/ left behind."""
    from dlrmtrain.run.checkpoint import verify_checkpoint

    disk = small_disk(900)
    job = start_cli_job(tmp_path, *CKPT, f"checkpoint.dir={disk}")
    try:
        rc, _ = finish(job, START_TIMEOUT)
    finally:
        kill_job(job)
    out = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert rc != 0, out
    assert f"warning: {disk} has " in out and "needs room for 3 checkpoints" in out
    [error] = [l for l in _lines(out) if l.startswith("error: checkpoint of step")]
    assert f"could not be written to {disk}" in error and "needs about" in error
    assert "free there" in error and "No space left on device" in error
    assert "Traceback" not in out and "enforce fail" not in out, out
    assert not list(disk.glob("*.partial"))
    kept = sorted(disk.glob("step_*"))
    assert len(kept) == 2 and all(verify_checkpoint(p) is None for p in kept)
    records = metrics(tmp_path / "d")
    assert records[-1]["kind"] == "stopped" and records[-1]["reason"] == error[len("error: "):]


def _train_with_warn(rank, world_size, out_dir, disk):
    from tests.common import train_on_rank, tiny_overrides

    return train_on_rank(rank, world_size, None, tiny_overrides(
        out_dir, *CKPT, f"checkpoint.dir={disk}", "checkpoint.on_error=warn",
        "checkpoint.every_steps=1", "run.max_steps=6"))


def test_checkpoint_on_error_warn_trains_on_and_says_so_at_every_failed_save(tmp_path, small_disk):
    from tests.multiproc import run_ranks

    disk = small_disk(700)  # a world of one writes about 330 KB per checkpoint: two fit
    [summary] = run_ranks(_train_with_warn, 1, str(tmp_path), str(disk), timeout=200)
    assert summary["steps"] == 6
    records = metrics(tmp_path / "d")
    failed = [r["step"] for r in records if r["kind"] == "checkpoint_failed"]
    saved = [r["step"] for r in records if r["kind"] == "checkpoint"]
    assert saved == [1, 2] and failed == [3, 4, 5, 6]  # retention frees room only after a save
    assert all("No space left on device" in r["error"] for r in records
               if r["kind"] == "checkpoint_failed")
    assert not list(disk.glob("*.partial"))


def _fill(disk: Path) -> None:
    """Fill the file system of `disk` up to its last byte."""
    with pytest.raises(OSError):
        with open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()


def test_a_record_that_cannot_be_written_is_an_error_naming_the_file(small_disk):
    from dlrmtrain.run.directory import RunClaim
    from dlrmtrain.run.errors import RecordWriteError
    from dlrmtrain.run.records import RunRecords
    from tests.common import tiny_config

    disk = small_disk(64)
    records = RunRecords(disk / "r", tiny_config(str(disk)), RunClaim("id", False, False))
    _fill(disk)
    with pytest.raises(RecordWriteError, match=rf"{disk / 'r' / 'metrics.jsonl'}: No space left"):
        for step in range(10_000):
            records.log("train", step=step, loss=0.5)
    with pytest.raises(RecordWriteError, match=r"summary.json: No space left"):
        records.write_json("summary.json", {"steps": list(range(10_000))})
    records.close()


def test_mlperf_log_that_cannot_be_written_is_an_error_naming_it(small_disk):
    """The stock logging handler printed "--- Logging error ---" and went on: a gap."""
    from dlrmtrain.mlperf.logger import build_mlperf_logger
    from dlrmtrain.run.errors import RecordWriteError

    disk = small_disk(64)
    logger = build_mlperf_logger("dlrm", disk / "mlperf.log", rank=0)
    _fill(disk)
    with pytest.raises(RecordWriteError, match=rf"{disk / 'mlperf.log'}: No space left"):
        for _ in range(10_000):
            logger.cache_clear()
    logger.close()
