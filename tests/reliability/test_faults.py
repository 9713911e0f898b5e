"""Fault injection on real `torchrun` jobs (2 Gloo ranks, tiny tables).

For each fault: the job ends within a stated bound, every checkpoint that was
complete before the fault is still valid, and the next run (`checkpoint.resume=true`)
continues from the newest valid one and finishes. Bounds are generous for a
loaded 2-core machine; what they guard against is a hang (torch's default
collective timeout is 300 s).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.reliability.jobs import (finish, kill_job, metrics, output_of, start_job,
                                    wait_until, worker_pid)

# 16 steps per epoch; a checkpoint after every step, so a kill most likely lands in a save.
LONG = ["run.name=f", "run.epochs=1000", "eval.enabled=false", "checkpoint.every_steps=1",
        "checkpoint.keep=3"]
START_TIMEOUT = 150  # torchrun + imports + model build on a busy 2-core machine
END_BOUND = 30       # a job whose rank died must be gone within this


def _checkpoints(run_dir: Path) -> dict[int, str | None]:
    """step → None when the checkpoint verifies, else the reason it does not."""
    from dlrmtrain.checkpoint import verify_checkpoint

    root = run_dir / "checkpoints"
    return {int(p.name.split("_")[1]): verify_checkpoint(p)
            for p in root.iterdir() if p.name.startswith("step_") and "." not in p.name}


def _trained_past(run_dir: Path, step: int):
    return lambda: any(r["kind"] == "checkpoint" and r["step"] >= step for r in metrics(run_dir))


def _resume_and_finish(tmp_path: Path, extra_steps: int = 3, *overrides: str) -> dict:
    """Resume the run; check it finishes and continues from the newest valid checkpoint."""
    run_dir = tmp_path / "f"
    valid = sorted(s for s, problem in _checkpoints(run_dir).items() if problem is None)
    assert valid, _checkpoints(run_dir)
    before = [r for r in metrics(run_dir) if r["kind"] == "train"]
    target = valid[-1] + extra_steps
    job = start_job(tmp_path, *LONG, "checkpoint.resume=true", f"run.max_steps={target}",
                    "checkpoint.every_steps=0", *overrides)
    rc, _ = finish(job, START_TIMEOUT)
    assert rc == 0, output_of(tmp_path)[-3000:]
    records = metrics(run_dir)
    # Nothing logged before the fault is lost: the resumed run only appends.
    assert [r for r in records if r["kind"] == "train"][:len(before)] == before
    marker = [r for r in records if r["kind"] == "resumed"][-1]
    after = [r["step"] for r in records[records.index(marker):] if r["kind"] == "train"]
    assert after == list(range(marker["step"] + 1, target + 1))
    assert not list((run_dir / "checkpoints").glob("*.partial"))  # the dead save is cleaned
    return marker


def test_kill_9_of_one_rank_mid_run_then_resume(tmp_path):
    job = start_job(tmp_path, *LONG)
    try:
        wait_until(_trained_past(tmp_path / "f", 3), START_TIMEOUT, job)
        os.kill(worker_pid(job, 1), signal.SIGKILL)
        rc, seconds = finish(job, END_BOUND)
    finally:
        kill_job(job)
    assert rc != 0 and seconds < END_BOUND
    marker = _resume_and_finish(tmp_path)
    checkpoints = _checkpoints(tmp_path / "f")
    assert marker["checkpoint"].endswith(f"step_{marker['step']}")
    assert all(problem is None for step, problem in checkpoints.items())


def test_sigint_to_torchrun_then_resume_past_a_corrupted_newest_checkpoint(tmp_path):
    job = start_job(tmp_path, *LONG)
    try:
        wait_until(_trained_past(tmp_path / "f", 3), START_TIMEOUT, job)
        os.kill(job.pid, signal.SIGINT)
        rc, seconds = finish(job, END_BOUND)
    finally:
        kill_job(job)
    assert rc != 0 and seconds < END_BOUND
    valid = sorted(s for s, p in _checkpoints(tmp_path / "f").items() if p is None)
    assert len(valid) >= 2
    newest = tmp_path / "f" / "checkpoints" / f"step_{valid[-1]}"
    shard = next(p for p in sorted(newest.iterdir()) if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")  # one flipped byte
    marker = _resume_and_finish(tmp_path)
    assert marker["step"] == valid[-2]  # the corrupted one was refused


def test_frozen_rank_ends_the_job_within_the_collective_timeout(tmp_path):
    timeout_s = 10
    job = start_job(tmp_path, *LONG, f"run.collective_timeout_s={timeout_s}")
    try:
        wait_until(_trained_past(tmp_path / "f", 2), START_TIMEOUT, job)
        os.kill(worker_pid(job, 1), signal.SIGSTOP)  # alive, but never answers again
        rc, seconds = finish(job, timeout_s + END_BOUND)
    finally:
        kill_job(job)
    assert rc != 0 and seconds < timeout_s + END_BOUND
    assert any(p is None for p in _checkpoints(tmp_path / "f").values())
