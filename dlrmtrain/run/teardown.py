"""What a rank whose run cannot go on leaves behind (the error itself: run/failure.py).

A start that failed leaves nothing: the records a new run began are removed (a retry
then needs no run.overwrite), those of a resumed one closed. A run that stops after it
began training says so where a reader looks: a `stopped` line in metrics.jsonl, and an
`aborted` run_stop in mlperf.log while its MLPerf clock runs. `FailureRecords` is the one
place a failure path writes to either log.

Rank 0 writes the records. When rank 0 is the rank lost, the lowest rank left (the one
that names it: PeerFailure.reporting_rank) writes the `stopped` record in its place
(`records_of_lost_writer`): only where it sees the run's own folder (its run.json names
this run) and can take the folder's lock, which a rank 0 still alive somewhere holds, so
a run's records always have one writer, appending. When rank 0 is lost while the Trainer
is still being built, that rank ends the start as rank 0 would have
(`undo_start_of_lost_writer`): a new run's records removed (it trained nothing and has
no checkpoint; a retry needs no run.overwrite), a resumed one's closed with a `stopped`
record. A new run's run.json is its first record, so records begun always say whose
they are.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

from dlrmtrain.run.directory import RECORD_FILES, RunClaim, read_identity
from dlrmtrain.run.errors import SetupError
from dlrmtrain.run.lock import RunLock
from dlrmtrain.run.records import open_run_records, set_aside_torn_lines

LOCK_WAIT_S = 5.0
"""How long the rank taking over waits for a dead rank 0's lock (the kernel drops it as
the process ends, a moment after its connections close)."""


class FailureRecords:
    """The run's metrics records and MLPerf log as a failure path sees them: either may
    not be open yet (a start can fail before it opens them)."""

    def __init__(self, records: Optional[Any] = None, mlperf: Optional[Any] = None) -> None:
        self.records, self.mlperf = records, mlperf

    def stopped(self, step: int, reason: str, epochs_done: float, samples: int,
                clock_running: bool = True) -> None:
        """Record a stop after `step` (best effort: the records may be what failed); the
        MLPerf run_stop only while its clock runs (not before run_start, not twice)."""
        try:
            self.records.log("stopped", step=step, reason=reason)
            if clock_running:
                self.mlperf.run_stop("aborted", epochs_done, samples_count=samples)
        except Exception:  # noqa: BLE001 - the records themselves may be what failed
            pass

    def close(self) -> None:
        for opened in (self.records, self.mlperf):
            if opened is not None:
                opened.close()


def writes_for_lost_rank0(error: BaseException, rank: int) -> bool:
    """Whether this rank writes the records' `stopped` line: rank 0 (their writer) is lost
    and this is the lowest rank left."""
    return rank != 0 and 0 in getattr(error, "lost", ()) and getattr(
        error, "reporting_rank", None) == rank


def records_of_lost_writer(run_dir: Path, run_id: str, lock: RunLock,
                           open_records: Callable[[], FailureRecords]) -> Optional[FailureRecords]:
    """The run's records in `run_dir`, opened to append by a rank other than 0 whose rank 0
    is lost (module docstring); None where this rank must not write them."""
    if not _taken_over(run_dir, run_id, lock):
        return None
    set_aside_torn_lines(run_dir)  # rank 0 may have died mid-record
    return open_records()


def _taken_over(run_dir: Path, run_id: str, lock: RunLock) -> bool:
    """Whether `run_dir` here is this run's and its lock is now this rank's."""
    identity = read_identity(run_dir)
    if identity is None or identity.get("run_id") != run_id:  # not this run's folder here
        return False
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            lock.acquire()
            return True
        except SetupError:  # rank 0 lives on somewhere (or has not quite ended yet)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def undo_start_of_lost_writer(run_dir: Path, run_id: str, lock: RunLock, resuming: bool,
                              open_records: Callable[[], FailureRecords], stop: tuple[int, str]
                              ) -> None:
    """End a start whose rank 0 (the records' writer) is lost, as it would have (module
    docstring): a resumed run gets a `stopped` record (`stop`: its step and reason), a new
    one's records are removed; nothing where this rank must not write them. The lock is
    released again."""
    if not _taken_over(run_dir, run_id, lock):
        return
    try:
        if resuming:
            set_aside_torn_lines(run_dir)  # rank 0 may have died mid-record
            opened = open_records()
            opened.stopped(*stop, epochs_done=0.0, samples=0, clock_running=False)
            opened.close()
        else:
            undo_start(FailureRecords(), run_dir, remove_records=True)
    finally:
        lock.release()


def undo_start(opened: FailureRecords, run_dir: Path, remove_records: bool) -> None:
    """Close what a failed start opened; with `remove_records` (rank 0 of a new run) also
    delete the records it began in `run_dir`."""
    opened.close()
    if remove_records:
        for name in RECORD_FILES:
            (run_dir / name).unlink(missing_ok=True)


def opened_as_writer(cfg: Any, run_id: str,
                     open_mlperf_log: Optional[Callable[[], Any]] = None) -> FailureRecords:
    """The run's records (and with `open_mlperf_log`, which opens it as rank 0 does, to
    append, its MLPerf log) opened to append, as rank 0 has them: what the rank taking
    over writes to."""
    resumed = RunClaim(run_id, resuming=True, adopt_run_id=False)
    return FailureRecords(open_run_records(cfg, 0, resumed),
                          open_mlperf_log() if open_mlperf_log is not None else None)
