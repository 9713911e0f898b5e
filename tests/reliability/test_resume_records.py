"""Issue 34's record probe as a user runs it: `dlrmtrain train --nproc 2` (real ranks,
tiny tables), then a resume into the same folder whose every checkpoint is damaged
and whose metrics.jsonl ends in a torn line: refused (exit 2, one line, each damaged
checkpoint named), every record byte for byte as it was (the torn line too: the
refusal comes before anything is touched). The rest in one process, cheaper:
test_run_ownership.py (a finished run without checkpoints, the torn line set aside).
"""

from __future__ import annotations

from pathlib import Path

from tests.reliability.jobs import finish, kill_job, start_cli_job

RUN = ["run.name=r", "eval.enabled=false", "checkpoint.every_steps=2"]
START_TIMEOUT = 150  # launcher + imports + model build on a busy 2-core machine
TORN = b'{"kind": "train", "time": 17.5, "step": 3, "lo'


def _train(tmp_path: Path, log_name: str, *overrides: str) -> tuple[int, str]:
    job = start_cli_job(tmp_path, *RUN, *overrides, log_name=log_name)
    try:
        rc, _ = finish(job, START_TIMEOUT)
    finally:
        kill_job(job)
    return rc, (tmp_path / log_name).read_text()


def _records(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())
            if p.is_file() and p.name != "run.lock"}


def test_a_resume_without_a_usable_checkpoint_is_refused_and_writes_nothing(tmp_path):
    run_dir = tmp_path / "r"
    rc, out = _train(tmp_path, "first.out", "run.max_steps=4")
    assert rc == 0, out[-3000:]
    with open(run_dir / "metrics.jsonl", "ab") as f:  # killed while writing a record
        f.write(TORN)
    for ckpt in (run_dir / "checkpoints").glob("step_*"):  # every checkpoint damaged
        shard = next(p for p in sorted(ckpt.iterdir()) if p.suffix == ".distcp")
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    before = _records(run_dir)
    rc, out = _train(tmp_path, "refused.out", "run.max_steps=6", "checkpoint.resume=true")
    assert rc == 2, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out, out[-3000:]
    assert errors[0].startswith(f"error: cannot resume {run_dir}: it finished at step 4")
    assert errors[0].count("checksum differs from the manifest (corrupted)") == 2
    assert "run.overwrite=true" in errors[0] and "another run.name" in errors[0]
    assert _records(run_dir) == before  # no second trajectory from step 0, no torn-line move
