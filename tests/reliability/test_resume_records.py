"""One real `dlrmtrain train --nproc 2` job (real ranks, tiny tables) serves two of issue
34's probes:

- a stalled rank: rank 1 stopped (SIGSTOP) past run.stall_warn_s, then continued, is named
  in a warning within stall_warn_s + 10 s, a line says when it answers again, and the run
  finishes with the stall in summary.json's stalled_seconds, outside the training time
  (run/peers.py's heartbeat; a rank frozen for good: test_peer_failures.py);
- then a resume into the same folder whose every checkpoint is damaged and whose
  metrics.jsonl ends in a torn line: refused (exit 2, one line, each damaged checkpoint
  named), every record byte for byte as it was (the torn line too: the refusal comes
  before anything is touched). The rest in one process, cheaper: test_run_ownership.py
  (a finished run without checkpoints, the torn line set aside).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.reliability.jobs import finish, kill_job, metrics, start_cli_job, wait_until, worker_pid

RUN = ["run.name=r", "run.epochs=10", "eval.enabled=false", "checkpoint.every_steps=2"]
START_TIMEOUT = 150  # launcher + imports + model build on a busy 2-core machine
STALL_WARN_S = 2
STEPS = 40  # rank 1 is stopped after step 3: the run must not end before
TORN = b'{"kind": "train", "time": 17.5, "step": 3, "lo'


@pytest.fixture(scope="module")
def stalled_run(tmp_path_factory) -> tuple[Path, int, str, dict]:
    """The folder, exit code, console and summary of a finished run whose rank 1 stalled."""
    root = tmp_path_factory.mktemp("records")
    log = root / "first.out"
    job = start_cli_job(root, *RUN, f"run.max_steps={STEPS}", f"run.stall_warn_s={STALL_WARN_S}",
                        log_name=log.name)
    try:
        wait_until(lambda: any(r["kind"] == "train" and r["step"] >= 3
                               for r in metrics(root / "r")), START_TIMEOUT, job)
        stalled = worker_pid(job, 1)
        os.kill(stalled, signal.SIGSTOP)
        try:
            wait_until(lambda: "warning: rank 1 has been silent" in log.read_text(),
                       STALL_WARN_S + 10, job)
        finally:
            os.kill(stalled, signal.SIGCONT)
        rc, _ = finish(job, START_TIMEOUT)
    finally:
        kill_job(job)
    summary = json.loads((root / "r" / "summary.json").read_text()) if rc == 0 else {}
    return root, rc, log.read_text(), summary


def test_a_stalled_rank_is_named_while_it_lasts_and_kept_out_of_the_throughput(stalled_run):
    _, rc, out, summary = stalled_run
    assert rc == 0, out[-3000:]
    assert "rank 1 answered again after" in out, out[-3000:]
    assert summary["stalled_seconds"] >= STALL_WARN_S  # named only once silent that long
    assert summary["train_seconds"] + summary["stalled_seconds"] <= summary["wall_seconds"]
    assert "stalled" in out and "not in the training time" in out


def _records(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())
            if p.is_file() and p.name != "run.lock"}


def test_a_resume_without_a_usable_checkpoint_is_refused_and_writes_nothing(stalled_run):
    root, rc, out, _ = stalled_run
    assert rc == 0, out[-3000:]
    run_dir = root / "r"
    with open(run_dir / "metrics.jsonl", "ab") as f:  # killed while writing a record
        f.write(TORN)
    for ckpt in (run_dir / "checkpoints").glob("step_*"):  # every checkpoint damaged
        shard = next(p for p in sorted(ckpt.iterdir()) if p.suffix == ".distcp")
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    before = _records(run_dir)
    job = start_cli_job(root, *RUN, f"run.max_steps={STEPS + 2}", "checkpoint.resume=true",
                        log_name="refused.out")
    try:
        rc, _ = finish(job, START_TIMEOUT)
    finally:
        kill_job(job)
    out = (root / "refused.out").read_text()
    assert rc == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out, out[-3000:]
    assert errors[0].startswith(f"error: cannot resume {run_dir}: it finished at step {STEPS}")
    assert errors[0].count("checksum differs from the manifest (corrupted)") == 2
    assert "run.overwrite=true" in errors[0] and "another run.name" in errors[0]
    assert _records(run_dir) == before  # no second trajectory from step 0, no torn-line move
