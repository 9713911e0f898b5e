"""Faults a first week brings (issue 29): a launcher killed with kill -9, an MLPerf run
past its timeout, two preprocessings into one folder, the runner's arguments. Real
processes, every wait bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

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
    out = "\n".join(p.read_text() for p in tmp_path.glob("job-*.out"))
    assert "frame #" not in out and "TCPStore" not in out, out[-3000:]  # no C++ frames
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
                           "--timeout-min", "0.02"],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    left = _processes_naming(str(out))
    _kill_all(left)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (f"dlrmtrain mlperf: run 0 (none, seed 0) did not finish within --timeout-min 0.02; "
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
    from dlrmtrain.mlperf_runner import main

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


def _raw_day(path: Path, seed: int, lines: int = 3000) -> Path:
    from tests.data.raw_rows import random_raw_lines, write_lines

    return write_lines(path, random_raw_lines(lines, seed=seed))


def _preprocess(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dlrmtrain", "preprocess", "--out", str(out),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_second_preprocess_into_one_folder_is_refused_naming_the_holder(tmp_path):
    from dlrmtrain.data.preprocess.pipeline import preprocess
    from dlrmtrain.run.errors import SetupError

    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SetupError) as refused:
            preprocess([_raw_day(tmp_path / "day_0", 1)], out, hash_range=1000, progress=False)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert str(refused.value).startswith(f"{out} is in use by another preprocess (host "
                                         f"{socket.gethostname()}, pid {holder.pid}, started 20")
    assert "choose another --out" in str(refused.value)
    assert sorted(p.name for p in out.iterdir()) == ["preprocess.lock"]  # nothing written


def test_two_preprocessings_started_at_once_into_one_folder_one_is_refused(tmp_path):
    """The probe: two `dlrmtrain preprocess` with different inputs and modes into one
    --out, at once: both exited 0, the manifest was one's, the other's part orphaned."""
    from dlrmtrain.data.formats.binary import read_manifest

    out = tmp_path / "out"
    days = [_raw_day(tmp_path / f"day_{i}", i, lines=15000) for i in range(2)]  # seconds each:
    jobs = {"vocab": _preprocess(out, "--hash-range", "1000", str(days[0])),  # they overlap
            "hash": _preprocess(out, "--mode", "hash", "--table-sizes", "100", str(days[1]))}
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


# ---- errors found inside the ranks --------------------------------------------------

def _dataset(folder: Path, rows_per_part: int = 2048) -> list[str]:
    """A tiny dataset on disk; the overrides that train on it."""
    from dlrmtrain.config import load_config
    from dlrmtrain.data.synthetic.files import write_synthetic_dataset

    write_synthetic_dataset(load_config(None, tiny_overrides(str(folder))).data, folder / "ds",
                            rows_per_part=rows_per_part, num_parts=2, progress=False)
    return ["data.source=criteo", f"data.path={folder / 'ds'}", "data.format=dlrmtrain",
            "data.split=names", "data.train_parts=[day_0]", "data.eval_parts=[day_1]"]


def _flip_id(folder: Path, row: int, table: int) -> None:
    """Set the high byte of one stored id: a huge id, as a flipped bit would make."""
    path = folder / "ds" / "parts" / "day_0" / "sparse.i32"
    data = bytearray(path.read_bytes())
    data[(row * 26 + table) * 4 + 3] = 0x40
    path.write_bytes(bytes(data))


def _run_to_its_error(folder: Path, *overrides: str) -> tuple[int, str]:
    """Run `dlrmtrain train` on 2 ranks to its end: (exit code, its one `error: ` line),
    checking that nothing else went wrong on the console."""
    job = start_cli_job(folder, *overrides)
    try:
        rc, _ = finish(job, START_TIMEOUT)
    finally:
        kill_job(job)
    out = "\n".join(p.read_text() for p in folder.glob("job-*.out"))
    assert "Traceback" not in out and "Connection closed by peer" not in out, out[-4000:]
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out[-4000:]  # printed once
    return rc, errors[0]


def test_an_id_beyond_its_table_seen_by_one_rank_stops_every_rank_with_one_line(tmp_path):
    """The probe: an id beyond its table's rows, in rank 1's half of the data only. Before:
    a traceback on both ranks (rank 0's ending in gloo's "Connection closed by peer"),
    exit 1, no `stopped` record. Now rank 1's error reaches rank 0 through the job's
    store: printed once, the records closed, exit 3."""
    files = _dataset(tmp_path)
    _flip_id(tmp_path, row=1500, table=5)  # rank 1 reads rows 1024.. of day_0, at step 4
    rc, line = _run_to_its_error(tmp_path, *files, "data.verify=false", "run.name=ids",
                                 "eval.enabled=false", "run.max_steps=16")
    assert rc == 3
    assert "table t_cat_5: id 1073741825 in rows 1408..1535 is outside its 3 rows" in line
    stopped = metrics(tmp_path / "ids")[-1]
    assert stopped["kind"] == "stopped" and f"error: {stopped['reason']}" == line


def test_a_checksum_mismatch_at_start_is_one_line_exit_2_and_leaves_nothing(tmp_path):
    """The probe: a part file whose checksum disagrees with its manifest. Before: a
    traceback on both ranks, exit 1. Now: one line naming the file, exit 2, and the
    run directory holds no record (a retry needs no run.overwrite)."""
    files = _dataset(tmp_path, rows_per_part=512)
    _flip_id(tmp_path, row=300, table=5)
    rc, line = _run_to_its_error(tmp_path, *files, "run.name=sum", "eval.enabled=false")
    assert rc == 2 and "parts/day_0/sparse.i32: sha256 mismatch" in line
    assert sorted(p.name for p in (tmp_path / "sum").iterdir()) == ["checkpoints", "run.lock"]


def _start_or_fail(config: str | None, overrides: list[str]) -> str:
    """Build and train a world of one; the named error it ended with ("SetupError: ...",
    "DataError: ..."), or "trained"."""
    from dlrmtrain.config import load_config
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.run.errors import RunError, SetupError
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config, validate_config

    cfg = resolve_config(load_config(config, overrides))
    validate_config(cfg, 1)
    try:
        trainer = Trainer(cfg, init_distributed("cpu"))
        trainer.train()
    except (SetupError, RunError) as e:
        return f"{type(e).__name__}: {e}"
    trainer.close()
    return "trained"


def _in_one_process(rank, world_size, cases):
    return {name: _start_or_fail(*case) for name, case in cases.items()}


def test_data_and_size_errors_inside_a_rank_are_named_errors(tmp_path):
    """The probes at a world of one (one spawned process): each problem is a SetupError
    naming the file or table (exit 2 under `dlrmtrain train`), found before allocation,
    and the failed start leaves no record; DLRMv4 without MLPerf logging trains."""
    from tests.multiproc import run_ranks

    files = _dataset(tmp_path, rows_per_part=512)
    dense = tmp_path / "ds" / "parts" / "day_0" / "dense.f32"
    dense.write_bytes(dense.read_bytes()[:-52])  # one row's dense values short
    huge = tiny_overrides(str(tmp_path), "run.name=huge", "data.table_sizes=[10000000000" +
                          ",7" * 25 + "]")
    cases = {
        "size": (None, tiny_overrides(str(tmp_path), "run.name=size", *files)),
        "yambda": (str(REPO / "configs/mini_dlrmv4.yaml"),
                   [f"run.output_dir={tmp_path}", "run.name=yambda", "data.source=yambda",
                    f"data.yambda.path={tmp_path / 'not_prepared'}"]),
        "huge": (None, huge),
    }
    no_mlperf = yaml.safe_load((REPO / "configs/mini_dlrmv4.yaml").read_text())
    del no_mlperf["mlperf"]  # MLPerf logging off, its eval grid at the full-size defaults
    (tmp_path / "v4.yaml").write_text(yaml.safe_dump(no_mlperf))
    cases["v4_no_mlperf"] = (str(tmp_path / "v4.yaml"), [f"run.output_dir={tmp_path}",
                                                         "run.name=v4", "run.max_steps=1",
                                                         "eval.enabled=false"])
    results = run_ranks(_in_one_process, 1, cases, timeout=300)[0]
    # before: "first eval ... is at 45,301,760 samples, beyond the 65,536", though MLPerf is off
    assert results.pop("v4_no_mlperf") == "trained"
    del cases["v4_no_mlperf"]
    assert results["size"].startswith(f"SetupError: {dense}: 26572 bytes, manifest implies "
                                      f"26624"), results["size"]
    assert results["yambda"].startswith("SetupError: ") and "not_prepared" in results["yambda"], \
        results["yambda"]
    assert results["huge"].startswith("SetupError: the embedding tables need at least 298.0 GB "
                                      "per rank") and "the largest, t_cat_0, has 10,000,000,000 " \
                                                      "rows × 8" in results["huge"], results["huge"]
    for name in cases:  # a failed start leaves no record behind
        assert not [p.name for p in (tmp_path / name).glob("*") if p.is_file()
                    and p.name != "run.lock"], name


def test_a_device_that_is_not_there_is_a_named_error():
    import torch

    from dlrmtrain.run.errors import SetupError
    from dlrmtrain.run.machine import check_device

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(SetupError, match="run.device=cuda: no CUDA device is visible"):
        check_device("cuda")
    check_device("cpu")


_TWICE = """
import os, signal, sys
from dlrmtrain.run.errors import RunInterrupted
from dlrmtrain.run.signals import install_stop_handlers
install_stop_handlers()
os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: the launcher's agent forwards it ...
try:
    os.kill(os.getpid(), signal.SIGTERM)  # ... and turns the second Ctrl-C into SIGTERM
except RunInterrupted as e:
    print(e, e.exit_code)
"""


def test_ctrl_c_twice_says_sigint():
    """The probe: Ctrl-C twice to `dlrmtrain train` said "interrupted by SIGTERM again":
    torchrun's agent sends the ranks SIGINT on the first Ctrl-C and, when a second one
    breaks its wait, SIGTERM. The rank names the signal the user sent."""
    proc = subprocess.run([sys.executable, "-c", _TWICE], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.strip() == "interrupted by SIGINT again; stopped at once 130", proc.stderr


def _sigterm_during_eval(rank, world_size, out_dir):
    """Train a world of one whose first evaluation gets SIGTERM after its first batch."""
    from dlrmtrain.config import load_config
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.run.errors import RunInterrupted
    from dlrmtrain.run.signals import install_stop_handlers
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config

    install_stop_handlers()
    cfg = resolve_config(load_config(None, tiny_overrides(out_dir, "run.name=ev",
                                                          "eval.evals_per_epoch=4",
                                                          "eval.batch_size=64")))
    trainer = Trainer(cfg, init_distributed("cpu"))
    batches = trainer.data.eval_batches

    def signalled():
        for i, item in enumerate(batches()):
            if i == 1:  # a scheduler's SIGTERM, mid-evaluation
                os.kill(os.getpid(), signal.SIGTERM)
            yield item

    trainer.data.eval_batches = signalled
    try:
        trainer.train()
    except RunInterrupted as e:
        return str(e)
    return "not interrupted"


def test_sigterm_during_an_evaluation_stops_it_and_trains_no_further_step(tmp_path):
    """The probe: a SIGTERM during an evaluation waited for the whole evaluation and then
    trained one more step. Now the evaluation stops at its next batch."""
    from tests.multiproc import run_ranks

    [message] = run_ranks(_sigterm_during_eval, 1, str(tmp_path), timeout=200)
    records = metrics(tmp_path / "ev")
    first_eval_step = 4  # 16 steps per epoch, 4 evaluations
    assert message == f"interrupted by SIGTERM at step {first_eval_step}; last checkpoint none"
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]
    assert not [r for r in records if r["kind"] == "eval"]
    assert records[-1]["kind"] == "stopped" and records[-1]["step"] == first_eval_step
