"""run/lifecycle.py in one process, a world of one on real files: what a start writes, what
its abort removes or keeps, where a stop signal stops the run, what a stop and a finish
leave behind. The same protocols across real ranks: tests/reliability/."""

from __future__ import annotations

import json
import signal
from functools import partial

import pytest
import torch

from dlrmtrain.config import load_config
from dlrmtrain.mlperf.logger import open_mlperf_logger
from dlrmtrain.run import signals
from dlrmtrain.run.checkpoint import TrainerPosition
from dlrmtrain.run.directory import RECORD_FILES
from dlrmtrain.run.errors import CheckpointWriteError, RunError, RunInterrupted, SetupError
from dlrmtrain.run.finished import FINISHED_FILE_ENV
from dlrmtrain.run.lifecycle import RunLifecycle
from dlrmtrain.run.lock import RunLock
from dlrmtrain.run.progress import RunProgress, Summary

CPU = torch.device("cpu")
TERM = int(signal.SIGTERM)


@pytest.fixture(autouse=True)
def alone(monkeypatch):
    """A world of one without a job store, and no stop signal received yet."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv(FINISHED_FILE_ENV, raising=False)
    monkeypatch.setattr(signals, "_received", None)  # restored after the test


def lifecycle_of(tmp_path, *overrides: str) -> RunLifecycle:
    cfg = load_config(None, [f"run.output_dir={tmp_path}", "run.name=life", "mlperf.enabled=true",
                             *overrides])
    return RunLifecycle(cfg, rank=0, world_size=1, open_mlperf_log=partial(open_mlperf_logger, cfg, "dlrm"))


def started(tmp_path, *overrides: str) -> RunLifecycle:
    """A lifecycle through its start: claimed, checkpoints opened, records open."""
    life = lifecycle_of(tmp_path, *overrides)
    life.start()
    life.open_checkpoints()
    life.open_records()
    return life


def records(life: RunLifecycle) -> list[dict]:
    return [json.loads(line) for line in (life.run_dir / "metrics.jsonl").read_text().splitlines()]


def lock_is_free(life: RunLifecycle) -> bool:
    try:
        probe = RunLock(life.run_dir)
        probe.acquire()
    except SetupError:
        return False
    probe.release()
    return True


def test_a_start_claims_the_directory_and_its_records_say_whose_they_are(tmp_path):
    life = started(tmp_path)
    assert not lock_is_free(life)  # a second run is refused while this one lives
    identity = json.loads((life.run_dir / "run.json").read_text())
    assert identity["run_id"] == life.claim.run_id == life.run_id
    assert (life.run_dir / "mlperf.log").is_file() and (life.run_dir / "config.yaml").is_file()
    life.close()
    assert lock_is_free(life)


def test_an_aborted_start_removes_a_new_runs_records_and_frees_the_directory(tmp_path):
    life = started(tmp_path)
    broken = ValueError("the model could not be built")
    assert life.abort_start(broken) is broken  # a bug keeps its traceback
    assert not any((life.run_dir / name).exists() for name in RECORD_FILES)
    assert lock_is_free(life)


def test_an_aborted_resume_keeps_the_records_it_appends_to(tmp_path):
    first = started(tmp_path)
    first.close()
    life = started(tmp_path, "checkpoint.resume=true")
    assert life.claim.resuming
    refused = SetupError("data.path: /nowhere does not exist")
    assert life.abort_start(refused) is refused
    assert all((life.run_dir / name).exists() for name in ("run.json", "config.yaml", "metrics.jsonl"))
    assert lock_is_free(life)


def test_a_refused_claim_writes_nothing(tmp_path):
    started(tmp_path).close()
    with pytest.raises(SetupError, match="already holds a run"):
        lifecycle_of(tmp_path).start()


def test_a_stop_signal_stops_the_run_at_the_next_logging_step_and_says_where(tmp_path):
    life = started(tmp_path, "logging.metrics_every_steps=5")
    life.begin_steps(total=20)
    life.after_step(2)
    signals.request_stop(TERM)
    life.after_step(3)  # asks for step 5, the next logging step: trains on
    life.after_step(4)
    with pytest.raises(RunInterrupted) as stopped:
        life.after_step(5)
    assert stopped.value.exit_code == 128 + TERM
    assert str(stopped.value) == "interrupted by SIGTERM at step 5; last checkpoint none"
    life.close()


def test_a_stop_signal_during_an_evaluation_stops_a_world_of_one_at_once(tmp_path):
    life = started(tmp_path)
    life.begin_steps(total=20)
    life.during_eval(4)  # no signal: the evaluation goes on
    signals.request_stop(TERM)
    with pytest.raises(RunInterrupted, match="at step 4"):
        life.during_eval(4)
    life.close()


def _running(step: int) -> RunProgress:
    run = RunProgress.begin(total=10, first_step=0, summary=Summary(world_size=1), device=CPU,
                            show_bar=False)
    run.completed, run.clock_running = step, True
    return run


def test_a_stopped_run_is_recorded_in_both_logs_and_frees_the_directory(tmp_path):
    life = started(tmp_path)
    life.mlperf.run_start()  # the MLPerf clock runs
    error = RunError("a record could not be written")
    assert life.stop(error, _running(6), epochs_done=0.5, samples=192) is error
    assert records(life)[-1]["kind"] == "stopped" and records(life)[-1]["step"] == 6
    assert '"status": "aborted"' in (life.run_dir / "mlperf.log").read_text().splitlines()[-1]
    assert lock_is_free(life)


def test_a_bug_while_training_is_returned_as_it_is_and_records_no_stop(tmp_path):
    life = started(tmp_path)
    bug = KeyError("a bug")
    assert life.stop(bug, _running(3), epochs_done=0.25, samples=96) is bug
    assert all(r["kind"] != "stopped" for r in records(life))
    life.close()


def test_a_failed_save_with_on_error_warn_is_recorded_and_training_goes_on(tmp_path, monkeypatch):
    life = started(tmp_path, "checkpoint.on_error=warn")

    def full_disk(*_args):
        raise CheckpointWriteError("checkpoint.dir: no space left on device")

    monkeypatch.setattr(life.checkpointer, "save", full_disk)
    position = TrainerPosition(step=4, epoch=0, step_in_epoch=4, schedule={})
    life.save_checkpoint(torch.nn.Linear(1, 1), None, position)  # no raise
    assert records(life)[-1] | {"time": 0} == {"kind": "checkpoint_failed", "time": 0, "step": 4,
                                               "error": "checkpoint.dir: no space left on device"}
    life.close()
    life = started(tmp_path, "checkpoint.on_error=stop", "run.overwrite=true")
    monkeypatch.setattr(life.checkpointer, "save", full_disk)
    with pytest.raises(CheckpointWriteError):
        life.save_checkpoint(torch.nn.Linear(1, 1), None, position)
    life.close()


def test_a_finished_run_says_so_then_tears_down(tmp_path, monkeypatch):
    marker = tmp_path / "finished"
    monkeypatch.setenv(FINISHED_FILE_ENV, str(marker))
    life = started(tmp_path)
    life.close()
    torn_down = []
    assert life.finish(7, lambda: torn_down.append(marker.is_file())) == 0
    assert torn_down == [True]  # said before the teardown barrier


def test_a_teardown_that_breaks_for_another_reason_is_raised(tmp_path):
    life = started(tmp_path)
    life.close()

    def bug():
        raise ValueError("not a lost peer")

    with pytest.raises(ValueError, match="not a lost peer"):
        life.finish(7, bug)
