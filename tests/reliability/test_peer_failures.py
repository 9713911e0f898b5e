"""A peer that dies, freezes or stalls, on real `dlrmtrain train --nproc 2` jobs (Gloo).

The rank left ends with one line naming the peer and what it saw, exit 3, a `stopped`
record and no traceback (kill -9 of rank 0, whose records the rank left then writes:
test_faults.py, on its checkpoint-save job; a stall shorter than the collective timeout, named while it
lasts and kept out of the throughput: test_resume_records.py, on the job that test
shares). Bounds are generous for a loaded 2-core machine; what they guard against is a
hang.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from dlrmtrain.run.directory import RECORD_FILES
from tests.reliability.jobs import (finish, kill_job, metrics, mlperf_keys, named,
                                    named_and_recorded, output_of, start_cli_job, start_job,
                                    wait_until, worker_pid)

LONG = ["run.name=f", "run.epochs=1000", "eval.enabled=false", "checkpoint.every_steps=2",
        "comm.codec=none"]
START_TIMEOUT = 150  # launcher + imports + model build on a busy 2-core machine
END_BOUND = 30       # a job whose rank died must be gone within this


def _trained_past(run_dir: Path, step: int):
    return lambda: any(r["kind"] == "train" and r["step"] >= step for r in metrics(run_dir))


def _stopped_record(run_dir: Path) -> dict:
    last = metrics(run_dir)[-1]
    assert last["kind"] == "stopped", last
    return last


def _error_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize("point, lost", [("build", 0), ("start", 0), ("end", 1), ("summary", 0), ("teardown", 0)])
def test_a_peer_lost_in_the_start_barrier_or_the_end_of_run_stats_is_named(tmp_path, point, lost):
    """A rank killed as it enters the start barrier (rank 0 here) or the end-of-run comm
    stats collective (rank 1): the rank left ended in a Gloo traceback there (exit 1, no
    record). Now it ends as for any lost peer: one line, exit 3, a `stopped` record; the
    MLPerf log gets no run_stop before its run_start, and no second one. Rank 0 killed
    while the Trainer shards its model (`build`: its new run's records begun) left them
    behind, half made; now the rank left removes them, as rank 0 would have. Rank 0 killed
    as it writes the summary (`summary`) or in the final teardown barrier (`teardown`) left a
    traceback and exit 1 on rank 1, no record; now the first is a lost peer like the others
    (rank 1 writes the `stopped` record), the second, after rank 0 said its records were
    complete, changes nothing: one line, exit 0."""
    job = start_job(tmp_path, point, str(lost), *LONG, "run.max_steps=3", "mlperf.enabled=true",
                    module="tests.reliability.dying_rank", launcher=True)
    try:
        rc, _ = finish(job, START_TIMEOUT)
    finally:
        kill_job(job)
    out, run_dir = output_of(tmp_path), tmp_path / "f"
    if point == "teardown":
        assert rc == 0, out[-3000:]
        _finished_despite_a_lost_peer(out, run_dir, lost)
        return
    assert rc == 3, out[-3000:]
    if point == "build":
        assert " was lost at step 0: " in named(out, lost), out[-3000:]
        assert not [n for n in RECORD_FILES if (run_dir / n).exists()], sorted(run_dir.iterdir())
        return
    line = named_and_recorded(out, run_dir, lost)
    keys = mlperf_keys(run_dir)
    if point == "start":
        assert " was lost at step 0: " in line and "run_start" not in keys, (line, keys)
        assert "run_stop" not in keys, keys
    else:  # end, summary: after the MLPerf clock stopped
        assert " was lost at step 3: " in line, line
        assert keys.count("run_stop") == 1, keys


def _finished_despite_a_lost_peer(out: str, run_dir: Path, lost: int) -> None:
    """A run whose rank `lost` died after the summary was written: the rank left says so in
    one line (no error, no traceback) and its records stay those of a finished run."""
    assert "Traceback" not in out and not _error_lines(out), out[-3000:]
    (line,) = [line for line in out.splitlines() if " was lost at step " in line]
    assert line.startswith(f"dlrmtrain: rank {lost}") and " was lost at step 3: " in line, line
    assert line.endswith("; the run had finished and its records are complete"), line
    assert (f"dlrmtrain: rank {lost} was killed by SIGKILL after the run had finished; "
            f"its records are complete") in out, out[-3000:]
    assert (run_dir / "summary.json").is_file(), sorted(run_dir.iterdir())
    assert "stopped" not in [r["kind"] for r in metrics(run_dir)], metrics(run_dir)[-1]
    assert mlperf_keys(run_dir).count("run_stop") == 1, mlperf_keys(run_dir)


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _sigterm_pending(pid: int) -> bool:
    """A SIGTERM sent to `pid` and not yet acted on (a stopped process keeps it pending)."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return bool(pending & (1 << (signal.SIGTERM - 1)))


def test_frozen_rank_is_named_at_the_collective_timeout(tmp_path):
    """Rank 1 stopped (SIGSTOP) for good: rank 0's collective fails after
    run.collective_timeout_s (not torch's default 300 s) and rank 0 ends with one line
    naming rank 1 as stopped, exit 3, a `stopped` record. torchrun then sends the frozen
    rank SIGTERM, which a stopped process leaves pending; its SIGKILL would follow after
    a fixed 30 s grace: the test gives that SIGKILL itself once the SIGTERM is pending."""
    timeout_s, slack = 10, 20
    job = start_cli_job(tmp_path, *LONG, f"run.collective_timeout_s={timeout_s}")
    try:
        wait_until(_trained_past(tmp_path / "f", 2), START_TIMEOUT, job)
        alive, frozen = worker_pid(job, 0), worker_pid(job, 1)
        os.kill(frozen, signal.SIGSTOP)  # alive, but never answers again
        start = time.monotonic()
        while not _ended(alive) and time.monotonic() - start < timeout_s + slack:
            time.sleep(0.1)
        assert _ended(alive), "rank 0 still waiting on the frozen rank"
        wait_until(lambda: _sigterm_pending(frozen), slack, job)  # torchrun is ending the job
        os.kill(frozen, signal.SIGKILL)  # torchrun's own, 30 s later
        rc, _ = finish(job, slack)
    finally:
        kill_job(job)
    out = output_of(tmp_path)
    assert rc == 3 and "Traceback" not in out, out[-3000:]
    (line,) = _error_lines(out)
    # gloo's words depend on the collective rank 0 waits in
    assert line.startswith("error: rank 1 (its process is stopped) stopped answering at step "), line
    assert "a collective timed out (Gloo: " in line, line
    assert _stopped_record(tmp_path / "f")["reason"] == line.removeprefix("error: ")
