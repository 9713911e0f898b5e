"""run/failure.py and run/teardown.py in one process: the error every rank ends with, read
and left in a real job store (a TCPStore this test serves, as torchrun's agent does), and
what a failed start or a stopped run leaves behind."""

from __future__ import annotations

import json
import signal

import pytest
import torch.distributed as dist

from dlrmtrain.run import signals
from dlrmtrain.run.directory import RECORD_FILES
from dlrmtrain.run.errors import (EXIT_USER_ERROR, RunAlreadyFinished, RunError, RunInterrupted,
                                  SetupError)
from dlrmtrain.run.failure import agreed_failure, as_run_stop, interrupted_message
from dlrmtrain.run.peers import PeerFailure
from dlrmtrain.run.stop import announced_stop
from dlrmtrain.run.lock import RunLock
from dlrmtrain.run.teardown import FailureRecords, undo_start, undo_start_of_lost_writer

GLOO_LOST = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4242")


@pytest.fixture(autouse=True)
def no_stop_signal(monkeypatch):
    monkeypatch.setattr(signals, "_received", None)  # restored after the test


@pytest.fixture
def job_store(monkeypatch):
    """Rank 0 of a world of two, its job's store served here."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
                       "WORLD_SIZE": "2", "RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    return store


@pytest.fixture
def alone(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("MASTER_PORT", raising=False)


def test_a_rank_that_decided_tells_the_peer_whose_collective_then_broke(job_store):
    refused = SetupError("data.path: /nowhere does not exist")
    assert agreed_failure(refused, 0, None) is refused
    assert announced_stop()["exit_code"] == EXIT_USER_ERROR
    adopted = agreed_failure(GLOO_LOST, 0, None)  # the peer's view: its barrier broke
    assert type(adopted) is SetupError and str(adopted) == str(refused)


def test_an_announced_interruption_and_run_error_keep_their_exit_codes(job_store):
    agreed_failure(RunInterrupted(signal.SIGTERM, "interrupted by SIGTERM at step 3"), 3, None)
    stop = agreed_failure(GLOO_LOST, 3, None)
    assert isinstance(stop, RunInterrupted) and stop.exit_code == 128 + signal.SIGTERM
    assert str(stop) == "interrupted by SIGTERM at step 3"


def test_a_finished_run_is_not_announced(job_store):
    done = RunAlreadyFinished("already finished")
    assert agreed_failure(done, 0, None) is done and announced_stop() is None


def test_a_lost_peer_is_named_and_announced(job_store):
    lost = agreed_failure(GLOO_LOST, 7, 4)
    assert isinstance(lost, PeerFailure)
    assert "rank 1" in str(lost) and "at step 7" in str(lost) and "last checkpoint step 4" in str(lost)
    assert announced_stop()["message"] == str(lost)


def test_after_a_stop_signal_a_broken_step_is_the_interruption(alone):
    signals.request_stop(signal.SIGTERM)
    stop = agreed_failure(RuntimeError("the step broke off"), 5, None)
    assert isinstance(stop, RunInterrupted) and stop.exit_code == 128 + signal.SIGTERM
    assert str(stop) == interrupted_message(signal.SIGTERM, 5, None) == \
        "interrupted by SIGTERM at step 5; last checkpoint none"


def test_a_bug_keeps_its_traceback(alone):
    bug = ValueError("a bug")
    assert agreed_failure(bug, 2, None) is bug
    assert as_run_stop(bug) is bug


def test_a_peer_refusal_after_the_start_ends_the_run_as_a_user_error():
    stop = as_run_stop(SetupError("refused"))
    assert type(stop) is RunError and stop.exit_code == EXIT_USER_ERROR and str(stop) == "refused"


class _Log:
    """A record writer: what was written to it, and whether it was closed."""

    def __init__(self, broken: bool = False) -> None:
        self.lines, self.closed, self.broken = [], False, broken

    def log(self, kind: str, **fields) -> None:
        if self.broken:
            raise OSError("No space left on device")
        self.lines.append((kind, fields))

    def run_stop(self, status: str, epochs: float, samples_count: int) -> None:
        self.lines.append(("run_stop", dict(status=status, epochs=epochs, samples=samples_count)))

    def close(self) -> None:
        self.closed = True


def test_a_stopped_run_says_so_in_both_logs_and_a_broken_record_does_not_mask_the_error():
    records, mlperf = _Log(), _Log()
    FailureRecords(records, mlperf).stopped(6, "a peer was lost", 0.5, 192)
    assert records.lines == [("stopped", {"step": 6, "reason": "a peer was lost"})]
    assert mlperf.lines == [("run_stop", {"status": "aborted", "epochs": 0.5, "samples": 192})]
    FailureRecords(_Log(broken=True), mlperf).stopped(6, "disk full", 0.5, 192)  # no raise


@pytest.mark.parametrize("resuming", [False, True])
def test_a_failed_start_removes_a_new_runs_records_and_keeps_a_resumed_ones(tmp_path, resuming):
    for name in RECORD_FILES:
        (tmp_path / name).write_text("x")
    records = _Log()
    undo_start(FailureRecords(records, None), tmp_path, remove_records=not resuming)
    assert records.closed
    assert sorted(p.name for p in tmp_path.iterdir()) == (sorted(RECORD_FILES) if resuming else [])


@pytest.mark.parametrize("resuming", [False, True])
def test_a_start_whose_rank0_is_lost_is_ended_by_the_rank_left_as_rank0_would(tmp_path, resuming):
    """Rank 0 lost while the Trainer is built: the rank that names it removes a new run's
    records (no half-made run left for a resume or `report` to misread) or closes a
    resumed one's with a `stopped` record; in a folder that is not this run's, nothing."""
    for name in RECORD_FILES:
        (tmp_path / name).write_text("x\n")
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "this"}))
    records = _Log()
    lock = RunLock(tmp_path)
    undo_start_of_lost_writer(tmp_path, "other", lock, resuming, lambda: FailureRecords(records),
                              stop=(0, "rank 0 was lost"))
    assert sorted(p.name for p in tmp_path.glob("*") if p.name != "run.lock") == sorted(RECORD_FILES)
    assert records.lines == []
    undo_start_of_lost_writer(tmp_path, "this", lock, resuming, lambda: FailureRecords(records),
                              stop=(0, "rank 0 was lost"))
    left = sorted(p.name for p in tmp_path.glob("*") if p.name != "run.lock")
    assert left == (sorted(RECORD_FILES) if resuming else [])
    assert records.lines == ([("stopped", {"step": 0, "reason": "rank 0 was lost"})] if resuming
                             else [])
    RunLock(tmp_path).acquire()  # released again: a retry can take the folder
