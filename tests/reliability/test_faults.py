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

from tests.reliability.jobs import (finish, kill_job, metrics, mlperf_keys, named_and_recorded,
                                    output_of, start_cli_job, start_job, wait_until, worker_pid)

# 16 steps per epoch; a checkpoint after every step, so a kill most likely lands in a save.
LONG = ["run.name=f", "run.epochs=1000", "eval.enabled=false", "checkpoint.every_steps=1",
        "checkpoint.keep=3"]
START_TIMEOUT = 150  # torchrun + imports + model build on a busy 2-core machine
END_BOUND = 30       # a job whose rank died must be gone within this


def _checkpoints(run_dir: Path) -> dict[int, str | None]:
    """step → None when the checkpoint verifies, else the reason it does not."""
    from dlrmtrain.run.checkpoint import verify_checkpoint

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
    console = sorted(tmp_path.glob("job-*.out"))[-1].read_text()  # the resumed job's
    assert "FutureWarning" not in console, console[-3000:]  # torch's ShardedTensor deprecation, x4
    records = metrics(run_dir)
    # Nothing logged before the fault is lost: the resumed run only appends.
    assert [r for r in records if r["kind"] == "train"][:len(before)] == before
    marker = [r for r in records if r["kind"] == "resumed"][-1]
    after = [r["step"] for r in records[records.index(marker):] if r["kind"] == "train"]
    assert after == list(range(marker["step"] + 1, target + 1))
    assert not list((run_dir / "checkpoints").glob("*.partial"))  # the dead save is cleaned
    return marker


def test_kill_9_of_rank_0_during_a_checkpoint_save_is_named_recorded_then_resumed(tmp_path):
    """Rank 0, the one that writes the records, is killed while a `step_N.partial/` is being
    written: rank 1 names it in one line (exit 3, no traceback; it ended with no record at
    all) and writes the `stopped` record and MLPerf's aborted run_stop in rank 0's place;
    every complete checkpoint stays valid, and the resumed run removes the dead save's
    folder and continues from the newest complete one."""
    run_dir = tmp_path / "f"
    job = start_cli_job(tmp_path, *LONG, "mlperf.enabled=true")
    try:
        wait_until(_trained_past(run_dir, 3), START_TIMEOUT, job)
        wait_until(lambda: any((run_dir / "checkpoints").glob("*.partial")), 60, job,
                   poll_s=0.002)  # a save of these tiny tables takes tens of ms
        os.kill(worker_pid(job, 0), signal.SIGKILL)
        rc, seconds = finish(job, END_BOUND)
    finally:
        kill_job(job)
    out = output_of(tmp_path)
    assert rc == 3 and seconds < END_BOUND, out[-3000:]
    line = named_and_recorded(out, run_dir, lost=0)
    assert "last checkpoint step" in line, line
    keys = mlperf_keys(run_dir)
    assert keys[-1] == "run_stop" and keys.count("run_stop") == 1, keys
    assert '"status": "aborted"' in (run_dir / "mlperf.log").read_text().splitlines()[-1]
    marker = _resume_and_finish(tmp_path, 3, "mlperf.enabled=true")
    assert marker["checkpoint"].endswith(f"step_{marker['step']}")
    assert all(problem is None for problem in _checkpoints(run_dir).values())


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
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    shard.write_bytes(bytes(data))
    marker = _resume_and_finish(tmp_path)
    assert marker["step"] == valid[-2]  # the corrupted one was refused


def test_second_signal_during_a_checkpoint_save_stops_after_it_and_names_both(tmp_path):
    """Ctrl-C, then SIGTERM while the checkpoint is being written (tables big enough that a
    save takes a while): the save ends and is valid, and the `stopped` record names both
    signals. The second signal used to be raised inside the save: a write failure."""
    run_dir = tmp_path / "f"
    job = start_cli_job(tmp_path, *LONG, "data.table_sizes=" + str([120000] * 26))  # 190 MB a save
    try:
        wait_until(_trained_past(run_dir, 2), START_TIMEOUT, job)
        wait_until(lambda: any((run_dir / "checkpoints").glob("*.partial")), 60, job, poll_s=0.002)
        ranks = [worker_pid(job, r) for r in (0, 1)]
        for sig in (signal.SIGINT, signal.SIGTERM):
            for pid in ranks:
                os.kill(pid, sig)
            time.sleep(0.05)
        rc, seconds = finish(job, END_BOUND + 30)
    finally:
        kill_job(job)
    out = output_of(tmp_path)
    assert rc == 128 + signal.SIGINT, out[-3000:]  # the first signal's, as for one alone
    assert "Traceback" not in out and "could not be written" not in out, out[-3000:]
    stopped = metrics(run_dir)[-1]
    assert stopped["kind"] == "stopped", stopped
    assert stopped["reason"].startswith("interrupted by SIGINT, then SIGTERM during the checkpoint "
                                        "save of step "), stopped
    saved = int(stopped["reason"].split("save of step ")[1].split(";")[0])
    assert f"stopped once it had ended; last checkpoint step {saved}" in stopped["reason"], stopped
    checkpoints = _checkpoints(run_dir)
    assert checkpoints[saved] is None and all(p is None for p in checkpoints.values()), checkpoints
    assert not list((run_dir / "checkpoints").glob("*.partial"))



def _preprocess_cmd(paths, out):
    import sys

    return [sys.executable, "data_prep/preprocess.py", "--out", str(out), "--hash-range", "1000",
            *map(str, paths)]


def _raw_days(folder: Path) -> list[Path]:
    from tests.data.raw_rows import random_raw_lines, write_lines

    lines = random_raw_lines(24000, seed=3)  # 3 files of ~2 MB: passes take long enough to hit
    return [write_lines(folder / f"day_{i}", lines[i * 8000:(i + 1) * 8000]) for i in range(3)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The preprocessing of `_raw_days` run once without a fault (shared by both kills)."""
    from dlrmtrain.data.preprocess.pipeline import preprocess

    folder = tmp_path_factory.mktemp("uninterrupted")
    preprocess(_raw_days(folder), folder / "out", "mlperf_vocab", hash_range=1000, progress=False)
    return folder / "out"


@pytest.mark.parametrize("kill_when", ["pass 1 staged day_0", "pass 2 started"])
def test_preprocessing_killed_in_each_pass_then_rerun(tmp_path, kill_when, uninterrupted):
    """kill -9 mid-pass; the rerun finishes and gives the uninterrupted result."""
    import subprocess

    import numpy as np

    from tests.data.preprocess.test_pipeline import load_everything
    from tests.reliability.jobs import REPO

    paths = _raw_days(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    trigger = (out / "staging" / "parts" / "day_0" / "part.json" if kill_when.startswith("pass 1")
               else out / "vocabulary.npz")
    job = subprocess.Popen(_preprocess_cmd(paths, out), cwd=REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not trigger.exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(job.pid, signal.SIGSTOP)
        assert job.poll() is None, f"preprocessing finished before it could be killed ({kill_when})"
        assert not (out / "dataset.json").exists()
        os.kill(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=30)
    # The rerun (in this process: the same code the command runs).
    from dlrmtrain.data.preprocess.pipeline import preprocess

    preprocess(paths, out, "mlperf_vocab", hash_range=1000, progress=False)
    assert not list(out.rglob("*.tmp-*")) and not (out / "staging").exists()
    for got, want in zip(load_everything(out), load_everything(uninterrupted)):
        np.testing.assert_array_equal(got, want)
