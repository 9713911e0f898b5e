"""Faults a first week brings (issue 29): a launcher killed with kill -9, an MLPerf run
past its timeout, two preprocessings into one folder, the runner's arguments. Real
processes, every wait bounded."""

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

from tests.common import tiny_overrides
from tests.reliability.jobs import (REPO, _descendants, finish, kill_job, metrics, start_cli_job,
                                    wait_until)

START_TIMEOUT = 150
GONE_BOUND = 40  # the ranks of a dead launcher stop at a step boundary, or 20 s later at once


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line contains `text` (a test's own folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes() and _alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_kill_9_of_the_launcher_leaves_no_rank_and_the_next_start_works(tmp_path):
    """The probe: kill -9 of `dlrmtrain train` at step 3. Before: both ranks, re-parented
    to PID 1, trained on to the end holding run.lock, so a restart was refused. Now each
    rank learns of its launcher's death (PR_SET_PDEATHSIG), stops at a step boundary with
    its records closed, and the next start on the same directory resumes."""
    from dlrmtrain.run.lock import RunLock

    run_dir = tmp_path / "k"
    job = start_cli_job(tmp_path, "run.name=k", "run.epochs=1000", "eval.enabled=false",
                        "checkpoint.every_steps=2")
    ranks: list[int] = []
    try:
        wait_until(lambda: any(r.get("step", 0) >= 3 for r in metrics(run_dir)), START_TIMEOUT, job)
        ranks = [p for p in _descendants(job.pid) if b"dlrmtrain.train" in
                 Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(ranks) == 2, ranks
        os.kill(job.pid, signal.SIGKILL)
        job.wait(timeout=10)
        deadline = time.monotonic() + GONE_BOUND
        while any(map(_alive, ranks)) and time.monotonic() < deadline:
            time.sleep(0.2)
        orphans = [p for p in ranks if _alive(p)]
    finally:
        _kill_all(ranks)
        kill_job(job)
    assert not orphans, f"ranks {orphans} outlived their launcher by {GONE_BOUND} s"
    stopped = metrics(run_dir)[-1]
    assert stopped["kind"] == "stopped" and "(its launcher died)" in stopped["reason"], stopped
    lock = RunLock(run_dir)
    lock.acquire()  # free again
    lock.release()
    done = start_cli_job(tmp_path, "run.name=k", f"run.max_steps={stopped['step'] + 2}",
                         "eval.enabled=false", "checkpoint.resume=true", log_name="restart.out")
    try:
        rc, _ = finish(done, START_TIMEOUT)
    finally:
        kill_job(done)
    assert rc == 0, (tmp_path / "restart.out").read_text()[-3000:]
    assert metrics(run_dir)[-1]["step"] == stopped["step"] + 2


def test_runner_timeout_ends_the_run_and_says_so_in_one_line(tmp_path):
    """The probe: `dlrmtrain mlperf --timeout-min 0.5` on a longer run ended in a
    TimeoutExpired traceback, and only the launcher was killed. Now the run's whole
    process group is stopped, and the runner says which run, exit 3."""
    config = tmp_path / "long.yaml"
    from dlrmtrain.config.loader import dump_config, load_config

    dump_config(load_config(REPO / "configs/quickstart.yaml",
                            tiny_overrides(str(tmp_path), "run.epochs=1000", "eval.enabled=false")),
                config)
    out = tmp_path / "m"
    proc = subprocess.run([sys.executable, "-m", "dlrmtrain", "mlperf", "--config", str(config),
                           "--out", str(out), "--runs", "1", "--codecs", "none",
                           "--timeout-min", "0.1"],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    left = _processes_naming(str(out))
    _kill_all(left)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (f"dlrmtrain mlperf: run 0 (none, seed 0) did not finish within --timeout-min 0.1; "
            f"stopped it and its ranks; output in {out}") in proc.stderr
    assert not left, "processes of the timed-out run are still alive"


@pytest.mark.parametrize("args, message", [
    (["--runs", "0"], "--runs must be at least 1, got 0"),
    (["--runs", "-2"], "--runs must be at least 1, got -2"),
    (["--timeout-min", "0"], "--timeout-min must be a positive number of minutes, got 0.0"),
    (["--ruleset", "9.9.9"], "--ruleset 9.9.9: no derived dlrm rules for it (known: 0.7.0, "),
    (["--codecs", "none,none"], "--codecs none,none: none given more than once"),
])
def test_runner_checks_its_arguments_before_writing_anything(tmp_path, capsys, args, message):
    """The probes: --runs 0 launched MLPerf's 15 runs (`args.runs or default`); a bad
    --ruleset, a negative --runs or a zero --timeout-min were found after results/,
    rules/ and systems/ were written; --codecs none,none failed after the first run."""
    from dlrmtrain.mlperf.runner import main

    out = tmp_path / "m"
    code = main(["--config", str(REPO / "configs/quickstart.yaml"), "--out", str(out), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"dlrmtrain mlperf: {message}") and err.count("\n") == 1, err
    assert not out.exists()


# ---- one writer per dataset directory ---------------------------------------------

_HOLD = """
import sys, time
from pathlib import Path
from dlrmtrain.run.lock import PREPROCESS_LOCK_FILE, RunLock
RunLock(Path(sys.argv[1]), PREPROCESS_LOCK_FILE).acquire()
print("held", flush=True)
time.sleep(60)
"""


def _raw_day(path: Path, seed: int) -> Path:
    from tests.data.raw_rows import random_raw_lines, write_lines

    return write_lines(path, random_raw_lines(3000, seed=seed))


def _preprocess(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dlrmtrain", "preprocess", "--out", str(out),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_second_preprocess_into_one_folder_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        second = _preprocess(out, "--hash-range", "1000", str(_raw_day(tmp_path / "day_0", 1)))
        _, err = second.communicate(timeout=120)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert second.returncode == 2
    assert err.startswith(f"error: {out} is in use by another preprocess (host "
                          f"{socket.gethostname()}, pid {holder.pid}, started 20"), err
    assert "choose another --out" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["preprocess.lock"]  # nothing written


def test_two_preprocessings_started_at_once_into_one_folder_one_is_refused(tmp_path):
    """The probe: two `dlrmtrain preprocess` with different inputs and modes into one
    --out, at once: both exited 0, the manifest was one's, the other's part orphaned."""
    from dlrmtrain.data.formats.binary import read_manifest

    out = tmp_path / "out"
    jobs = {"vocab": _preprocess(out, "--hash-range", "1000", str(_raw_day(tmp_path / "day_0", 1))),
            "hash": _preprocess(out, "--mode", "hash", "--table-sizes", "100",
                                str(_raw_day(tmp_path / "day_1", 2)))}
    results = {name: (job.wait(timeout=180), job.communicate()[1]) for name, job in jobs.items()}
    codes = sorted(rc for rc, _ in results.values())
    assert codes == [0, 2], results
    [(winner, _)] = [(n, r) for n, r in results.items() if r[0] == 0]
    [(_, (_, err))] = [(n, r) for n, r in results.items() if r[0] == 2]
    assert err.startswith("error: ") and "Traceback" not in err, err
    manifest = read_manifest(out)
    assert manifest["categorical_mode"] == {"vocab": "mlperf_vocab", "hash": "hash"}[winner]
    assert sorted(p.name for p in (out / "parts").iterdir()) == \
        [p["name"] for p in manifest["parts"]]  # no part the manifest does not list
