"""A `dlrmtrain mlperf` series is resumable, and the runner never outlives itself (issue 34):
kill -9 of the runner mid-run, then the same command resumes the interrupted run and
skips finished ones byte for byte, and another plan is refused before anything starts.
Real runners and ranks, every wait bounded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrmtrain.config.loader import dump_config
from dlrmtrain.testbed.shaped_link import unavailable_reason as link_unavailable_reason
from dlrmtrain.testbed.sim_nodes import unavailable_reason
from tests.common import tiny_config
from tests.mlperf.test_trainer_mlperf_log import MLPERF_SHAPE, RUN
from tests.reliability.jobs import REPO, metrics
from tests.reliability.test_first_week import GONE_BOUND, _alive, _kill_all, _processes_naming

START_TIMEOUT = 240
SYSTEM = "cpu2_gloo_codec-none"
# A run long enough to be caught mid-way (6 epochs of 16 steps, a target it never reaches),
# with a checkpoint every 4 steps to resume from.
LONG_RUN = [*MLPERF_SHAPE, *RUN, "run.epochs=6", "eval.evals_per_epoch=1", "eval.target_auc=0.99",
            "checkpoint.every_steps=4"]


def _runner(config: Path, out: Path, *args: str, log: Path) -> subprocess.Popen:
    """`dlrmtrain mlperf` of a one-run series, as a user starts it."""
    return subprocess.Popen([sys.executable, "-m", "dlrmtrain", "mlperf", "--config", str(config),
                             "--out", str(out), "--runs", "1", "--codecs", "none",
                             "--timeout-min", "4", *args],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
                            start_new_session=True)


def _wait_for(condition, runner: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert runner.poll() is None, f"runner ended early ({runner.returncode})"
        assert time.monotonic() < deadline, f"not reached within {timeout:.0f} s"
        time.sleep(0.05)


def _kill_9_past_step(process: subprocess.Popen, run_dir: Path, at_step: int, scope: Path) -> list[int]:
    """kill -9 `process` once `run_dir`'s run is past `at_step`; the processes naming `scope`
    still alive GONE_BOUND seconds later (left to the caller to kill)."""
    _wait_for(lambda: any(r.get("step", 0) >= at_step for r in metrics(run_dir)), process, START_TIMEOUT)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    deadline = time.monotonic() + GONE_BOUND
    while _processes_naming(str(scope)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _processes_naming(str(scope))


def _kill_9_mid_run(config: Path, out: Path, run_dir: Path, log: Path, *args: str,
                    at_step: int = 5) -> list[int]:
    """Start the runner, kill -9 it once its run is past `at_step`; the processes naming
    `out` that are still alive GONE_BOUND seconds later (killed then)."""
    runner = _runner(config, out, *args, log=log)
    try:
        return _kill_9_past_step(runner, run_dir, at_step, out)
    finally:
        _kill_all(_processes_naming(str(out)))
        if runner.poll() is None:
            runner.kill()
            runner.wait(timeout=10)


@pytest.fixture(scope="module")
def killed_series(tmp_path_factory):
    """A one-run series whose runner was killed with kill -9 at step 5."""
    root = tmp_path_factory.mktemp("series")
    config = root / "long.yaml"
    dump_config(tiny_config(str(root / "unused"), *LONG_RUN), config)
    out = root / "m"
    run_dir = out / "runs" / SYSTEM / "run0_seed0"
    left = _kill_9_mid_run(config, out, run_dir, root / "first.out")
    console = run_dir.with_name("run0_seed0.out")
    checkpoints = sorted(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*")
                         if p.name[5:].isdigit())
    return {"config": config, "out": out, "run_dir": run_dir, "left": left,
            "last_checkpoint": checkpoints[-1] if checkpoints else None,
            "metrics": (run_dir / "metrics.jsonl").read_bytes(),
            "console": console.read_bytes(), "root": root}


def test_kill_9_of_the_runner_leaves_no_process_and_a_stopped_record(killed_series):
    """The probe: kill -9 of `dlrmtrain mlperf` left its launcher and both ranks training
    (3 processes, alive 20 s later), the run ended without a `stopped` record. Now the
    launcher gets SIGTERM when the runner dies (run/parent.py), torchrun passes it on."""
    assert not killed_series["left"], "processes of the killed runner's run are still alive"
    stopped = metrics(killed_series["run_dir"])[-1]
    assert stopped["kind"] == "stopped" and "interrupted by SIGTERM" in stopped["reason"], stopped
    assert (b"the process that started this run (pid " in killed_series["console"]
            and b"died; the run stops" in killed_series["console"])


def _snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_the_same_command_resumes_then_skips_and_another_plan_is_refused(killed_series, capsys):
    """The probes: re-running `dlrmtrain mlperf` on its --out started ranks that refused the
    folder (exit 3 after 18 s) and overwrote the console log. Now the interrupted run
    resumes from its checkpoint (every record before it kept), a finished run is skipped
    with every file of it untouched, and another plan is refused: exit 2, one line,
    nothing written."""
    from dlrmtrain.mlperf_runner import main

    config, out, run_dir = killed_series["config"], killed_series["out"], killed_series["run_dir"]
    same = ["--config", str(config), "--out", str(out), "--runs", "1", "--codecs", "none",
            "--timeout-min", "4"]
    try:
        rc = main(same)
    finally:
        _kill_all(_processes_naming(str(out)))
    assert rc == 1, capsys.readouterr()  # never converged: no score, but complete
    records = (run_dir / "metrics.jsonl").read_bytes()
    assert records.startswith(killed_series["metrics"])  # appended to, never rewritten
    resumed = [r for r in metrics(run_dir) if r["kind"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] == killed_series["last_checkpoint"], resumed
    console = run_dir.with_name("run0_seed0.out").read_bytes()
    assert console.startswith(killed_series["console"]) and b"checkpoint.resume=true" in console
    result = out / "results" / SYSTEM / "dlrm" / "result_0.txt"
    assert result.read_bytes() == (run_dir / "mlperf.log").read_bytes()

    kept = {k: v for k, v in _snapshot(out).items() if not k.startswith("report/")}
    capsys.readouterr()
    assert main(same) == 1
    assert "(finished earlier, kept as it was)" in capsys.readouterr().out
    after = _snapshot(out)
    for name, data in kept.items():  # the series' own summary and lock may be rewritten
        if name not in ("summary.json", "series.lock"):
            assert after[name] == data, f"{name} changed"

    before = _snapshot(out)
    assert main(["--config", str(config), "--out", str(out), "--runs", "2", "--codecs", "none,dedup",
                 "optim.lr=0.2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dlrmtrain mlperf: --out {out} holds a "
                                                   f"series with another plan"), err
    for differs in ('codecs: ["none"] → ["none", "dedup"]', "config.optim.lr: 0.05 → 0.2",
                    "seeds: [0] → [0, 1]"):
        assert differs in err, err
    assert _snapshot(out) == before


def test_an_interrupted_run_without_a_checkpoint_is_set_aside_whole(killed_series, tmp_path):
    """"Restart cleanly" never erases: the interrupted run's folder and console file are
    moved to <run>.interrupted-<n> (the first free n), byte for byte, and the run
    starts afresh under its own name."""
    from dlrmtrain.mlperf.series import prepare_run

    run_dir = tmp_path / "run0_seed0"
    shutil.copytree(killed_series["run_dir"], run_dir)
    shutil.rmtree(run_dir / "checkpoints")  # as a run without checkpoints leaves it
    console = tmp_path / "run0_seed0.out"
    console.write_bytes(killed_series["console"])
    (tmp_path / "run0_seed0.interrupted-1").mkdir()  # an earlier one: n = 2
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}

    state = prepare_run(tmp_path / "result_0.txt", run_dir, console)

    aside = tmp_path / "run0_seed0.interrupted-2"
    assert state.set_aside == aside and not state.finished and state.resume_from is None
    assert not run_dir.exists() and not console.exists()
    assert {p.name: p.read_bytes() for p in aside.iterdir() if p.is_file()} == before
    assert (tmp_path / "run0_seed0.interrupted-2.out").read_bytes() == killed_series["console"]
    with_checkpoint = prepare_run(tmp_path / "result_0.txt", killed_series["run_dir"], console)
    assert with_checkpoint.resume_from is not None and with_checkpoint.set_aside is None


SIM_REASON = unavailable_reason(2)


@pytest.mark.skipif(SIM_REASON is not None, reason=str(SIM_REASON))
def test_kill_9_of_the_runner_on_simulated_nodes_leaves_no_agent(tmp_path):
    """With --sim-nodes the runner's launcher runs one torchrun agent per node, in
    namespaces of their own: kill -9 of the runner left the launcher, both agents and
    their ranks running. Now the launcher stops with the runner, the simulation with the
    launcher, and each agent with the simulation."""
    config = tmp_path / "long.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *LONG_RUN), config)
    out = tmp_path / "m"
    run_dir = out / "runs" / "cpu2x1_gloo_codec-none" / "run0_seed0"
    left = _kill_9_mid_run(config, out, run_dir, tmp_path / "first.out", "--nproc", "1",
                           "--sim-nodes", "2", at_step=3)
    assert not left, "processes of the killed runner's simulated nodes are still alive"
    stopped = metrics(run_dir)[-1]
    assert stopped["kind"] == "stopped", stopped
    # each node's agent ended quietly (bare torchrun printed a SignalException traceback)
    console = run_dir.with_name("run0_seed0.out").read_text()
    assert "Traceback" not in console and "SignalException" not in console, console[-3000:]


def test_a_series_folder_is_claimed_by_one_plan_and_one_runner(tmp_path):
    """plan.json is written once, under series.lock; a second runner, another plan, a
    folder that is no series and a file are refused, each having written nothing."""
    from dlrmtrain.mlperf.series import SeriesRefused, claim

    out = tmp_path / "m"
    plan = {"codecs": ["none"], "rules": "a: 1\nb: 2\n"}
    held = claim(out, plan)
    with pytest.raises(SeriesRefused, match="in use by another dlrmtrain mlperf"):
        claim(out, plan)
    held.release()
    written = _snapshot(out)
    with pytest.raises(SeriesRefused, match=r'codecs: \["none"\] → \["dedup"\]; '
                                            r'rules: line 2 "b: 2" → "b: 3"'):
        claim(out, {"codecs": ["dedup"], "rules": "a: 1\nb: 3\n"})
    claim(out, plan).release()  # the same plan continues
    assert _snapshot(out).keys() == written.keys()
    assert json.loads((out / "plan.json").read_text()) == plan
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(SeriesRefused, match="holds files but no plan.json"):
        claim(tmp_path / "other", plan)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["notes.txt"]
    (tmp_path / "f").write_text("")
    with pytest.raises(SeriesRefused, match="is a file, not a folder"):
        claim(tmp_path / "f", plan)


def test_a_launcher_whose_owner_is_already_gone_stops_before_anything_starts(tmp_path):
    """The runner may die between starting a launcher and the launcher's death-signal
    request: the launcher then sees it is not its owner's child and stops at once."""
    from dlrmtrain.run.parent import OWNER_ENV

    proc = subprocess.run([sys.executable, "-m", "dlrmtrain", "train", "--config",
                           "configs/quickstart.yaml", f"run.output_dir={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), OWNER_ENV: "1"})
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert proc.stderr == ("dlrmtrain: the process that started this run (pid 1) died; "
                           "the run stops\n")
    assert not any(tmp_path.iterdir())


LINK_REASON = link_unavailable_reason()


@pytest.mark.skipif(LINK_REASON is not None, reason=str(LINK_REASON))
def test_kill_9_of_a_launcher_behind_a_shaped_link_leaves_no_rank(tmp_path):
    """`dlrmtrain train --link-gbit` runs a second launcher inside the shaped namespace:
    kill -9 of the first left that one and both ranks training. Now the inner launcher
    has the outer one as its owner and stops with it."""
    from tests.reliability.jobs import start_cli_job

    run_dir = tmp_path / "k"
    job = start_cli_job(tmp_path, "run.name=k", "run.epochs=1000", "eval.enabled=false",
                        "--link-gbit=1")
    try:
        left = _kill_9_past_step(job, run_dir, 3, tmp_path)
    finally:
        _kill_all(_processes_naming(str(tmp_path)))
    assert not left, "the inner launcher or its ranks outlived the killed launcher"
    stopped = metrics(run_dir)[-1]
    assert stopped["kind"] == "stopped" and "interrupted by SIGTERM" in stopped["reason"], stopped


TORCHRUN_GRACE_S = 30  # torchrun's own wait for a rank it sent SIGTERM, before SIGKILL
# An owner that starts `dlrmtrain train` as the runner does (its own pid in OWNER_ENV, the
# launcher in a process group of its own), says the launcher's pid, and waits.
_OWNER = """import os, subprocess, sys, time
owner_env, log = sys.argv[1], open(sys.argv[2], "w")
launcher = subprocess.Popen(sys.argv[3:], env={**os.environ, owner_env: str(os.getpid())},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
print(launcher.pid, flush=True)
time.sleep(600)
"""


def test_a_launcher_whose_owner_died_and_whose_run_cannot_stop_ends_itself(tmp_path):
    """The watchdog behind the owner's death signal (run/parent.py), untested until now: the
    owner dies while the rank is frozen (SIGSTOP), so no step boundary comes and torchrun
    waits on it; OWNER_GONE_STOP_S later (60 s; DLRMTRAIN_OWNER_GONE_STOP_S=1 here) the
    launcher ends its process group, saying so in one line. The rank, continued, stops on
    what its launcher's death left pending, with a `stopped` record: no process left."""
    from dlrmtrain.run.parent import OWNER_ENV, OWNER_GONE_STOP_ENV
    from tests.common import tiny_overrides
    from tests.reliability.jobs import worker_pid

    run_dir, log = tmp_path / "w", tmp_path / "launcher.out"
    launcher_cmd = [sys.executable, "-m", "dlrmtrain", "train", "--config", "configs/quickstart.yaml",
                    "--nproc=1", *tiny_overrides(str(tmp_path), "run.name=w", "run.epochs=1000",
                                                 "eval.enabled=false")]
    env = {**os.environ, "PYTHONPATH": str(REPO), OWNER_GONE_STOP_ENV: "1"}
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, OWNER_ENV, str(log), *launcher_cmd], cwd=REPO,
                             env={**env, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    rank = None
    try:
        launcher = int(owner.stdout.readline())
        _wait_for(lambda: any(r.get("step", 0) >= 2 for r in metrics(run_dir)), owner, START_TIMEOUT)
        rank = worker_pid(owner, 0)
        os.kill(rank, signal.SIGSTOP)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        died = time.monotonic()
        while _alive(launcher) and time.monotonic() - died < TORCHRUN_GRACE_S:
            time.sleep(0.1)
        launcher_took = time.monotonic() - died
        os.kill(rank, signal.SIGCONT)
        while _alive(rank) and time.monotonic() - died < 2 * GONE_BOUND:
            time.sleep(0.1)
        rank_left = _alive(rank)
    finally:
        _kill_all(_processes_naming(str(tmp_path)))
        if rank is not None and _alive(rank):
            os.kill(rank, signal.SIGCONT)
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=10)
    out = log.read_text()
    assert launcher_took < TORCHRUN_GRACE_S, out[-3000:]  # ended by the watchdog, not torchrun
    assert "dlrmtrain: the run did not stop within 1 s of its owner's death; ending it" in out, out
    assert not rank_left, "the frozen rank outlived its launcher"
    assert metrics(run_dir)[-1]["kind"] == "stopped", metrics(run_dir)[-3:]
