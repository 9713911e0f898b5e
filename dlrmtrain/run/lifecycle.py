"""A run's life on one rank, from the claim of its directory to the last teardown barrier:
the one object the Trainer asks; each protocol is a module of this package.

  start   rank 0 claims the run directory and holds its lock for the run's life
          (directory.py, lock.py); the checkpoints are opened (checkpoint.py: partial saves
          of writers that died removed, the one to resume chosen) and a resume with nothing
          to train or no checkpoint is refused (resume.py); once nothing can refuse the run,
          its records and MLPerf log are opened (records.py: a resumed run's torn last line
          set aside) and the chosen checkpoint is loaded
  abort   a start that failed is undone (teardown.py), also by the rank left where rank 0
          was lost, and the directory released; every rank ends with the same error
          (failure.py)
  stop    a stop signal stops every rank after the same logging step (signals.py, stop.py);
          a run that cannot go on gets a `stopped` record from its writer, or from the rank
          that names a lost rank 0 (teardown.py), and every rank ends with the same error
  finish  rank 0 says the records are complete (finished.py) before the teardown barrier:
          a peer lost there after that is one line, and the exit stays 0
A rank whose run stopped, or whose start every rank refused, leaves at once with one line
and its exit code (`end_rank`): its peers may be gone, so no teardown collective.

The MLPerf log is opened by a function the Trainer hands in (mlperf/ sits above this
package). The lifecycle holds no reference to the model, so a Trainer dropped before the
teardown barrier takes the sharded model with it (docs/design.md §6).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional

import torch
from tqdm import tqdm

from dlrmtrain.config.schema import Config
from dlrmtrain.run.checkpoint import Checkpointer, TrainerPosition
from dlrmtrain.run.console import print_once
from dlrmtrain.run.directory import RunClaim, checkpoint_dir_of, claim_run_dir, run_dir_of
from dlrmtrain.run.errors import EXIT_USER_ERROR, CheckpointWriteError, RunError, RunInterrupted
from dlrmtrain.run.failure import (agreed_failure, as_run_stop, interrupted_message,
                                   last_checkpoint_text)
from dlrmtrain.run.finished import announce_finished, finished_announced
from dlrmtrain.run.identity import math_config
from dlrmtrain.run.leftovers import remove_dead_partials
from dlrmtrain.run.lock import RunLock
from dlrmtrain.run.peers import peer_failure, stop_heartbeat
from dlrmtrain.run.progress import RunProgress
from dlrmtrain.run.rank0 import decide_on_rank0
from dlrmtrain.run.records import open_run_records, set_aside_torn_lines
from dlrmtrain.run.resume import codec_changes_since, refuse_what_cannot_resume
from dlrmtrain.run.signals import stop_signal, stop_signals_held
from dlrmtrain.run.stop import StopAtLoggingSteps
from dlrmtrain.run.teardown import (FailureRecords, opened_as_writer, records_of_lost_writer,
                                    undo_start, undo_start_of_lost_writer, writes_for_lost_rank0)

OpenMLPerfLog = Callable[..., Any]
"""`(rank, append=...)` → the run's MLPerf logger (mlperf/logger.open_mlperf_logger with the
config and benchmark bound)."""


class RunLifecycle:
    """One run's life on this rank (the module docstring), its methods in the order the
    Trainer calls them. Every rank calls each one; rank 0 writes what is written."""

    def __init__(self, cfg: Config, rank: int, world_size: int,
                 open_mlperf_log: OpenMLPerfLog) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.math = math_config(cfg, world_size)
        self.run_dir = run_dir_of(cfg)
        self.lock = RunLock(self.run_dir)  # rank 0 holds it from the claim to close()
        self._open_mlperf_log = open_mlperf_log
        self.claim: Optional[RunClaim] = None
        self.checkpointer: Optional[Checkpointer] = None
        self.records: Any = None  # the run's records and MLPerf log, once open_records made them
        self.mlperf: Any = None
        self._stops: Optional[StopAtLoggingSteps] = None  # the running train()'s

    def _say(self, text: str) -> None:
        if self.rank == 0:
            tqdm.write(text)

    @property
    def run_id(self) -> str:
        """The run's id: its claim's, or a resumed checkpoint's it adopted (prepare_checkpoints)."""
        return self.checkpointer.run_id if self.checkpointer is not None else self.claim.run_id

    @property
    def last_checkpoint(self) -> Optional[int]:
        """The step of the newest checkpoint written or loaded, if any."""
        return self.checkpointer.last_step if self.checkpointer is not None else None

    # ---- start --------------------------------------------------------------------
    def start(self) -> RunClaim:
        """Rank 0 claims the run directory (a refusal is every rank's); nothing is written yet.
        Everything from here to the first step runs under `abort_start`."""
        self.claim = decide_on_rank0(lambda: claim_run_dir(self.cfg, self.lock), self.rank)
        return self.claim

    def open_checkpoints(self) -> Optional[Path]:
        """The run's checkpoints (rank 0 removes partial saves of writers that died); the
        checkpoint to resume from, if the run resumes and one is valid."""
        cfg, claim = self.cfg, self.claim
        self.checkpointer = Checkpointer(checkpoint_dir_of(cfg), cfg.checkpoint.keep, self.rank,
                                         claim.run_id, self.math, log=self._say)
        if self.rank == 0:
            remove_dead_partials(self.checkpointer.root, log=self._say)
        return self.checkpointer.latest_valid(any_run=claim.adopt_run_id) if cfg.checkpoint.resume else None

    def refuse_what_cannot_resume(self, checkpoint: Optional[Path], planned_steps: int) -> None:
        """A resume with nothing to train, or no checkpoint for its records, stops here (resume.py)."""
        refuse_what_cannot_resume(self.cfg, self.claim.resuming, checkpoint, self.checkpointer,
                                  planned_steps, self.rank)

    def open_records(self) -> tuple[Any, Any]:
        """The run's records and its MLPerf log, opened once nothing can refuse the run (a
        resumed one appends to them); a new run's first record says whose they are (teardown.py)."""
        claim = self.claim
        if claim.resuming and self.rank == 0:  # a torn last line must not take the next record
            set_aside_torn_lines(self.run_dir, log=self._say)
        self.records = open_run_records(self.cfg, self.rank, claim)
        if not claim.resuming:
            self.records.set_identity(claim.run_id, self.math)
        self.mlperf = self._open_mlperf_log(self.rank, append=claim.resuming)
        return self.records, self.mlperf

    def prepare_checkpoints(self, model: torch.nn.Module, optimizer, device: torch.device,
                            checkpoint: Optional[Path]) -> Optional[TrainerPosition]:
        """Check the checkpoint directory holds `keep` + 1 checkpoints (where the run writes
        any), load `checkpoint` into the model and optimizer; record the run's identity, and
        where a resumed run restarted. The trainer's position in the checkpoint, if any."""
        cfg, claim, checkpoints = self.cfg, self.claim, self.checkpointer
        if cfg.checkpoint.every_steps or cfg.checkpoint.at_end:
            checkpoints.expect_size(model, optimizer, device)
        if cfg.checkpoint.resume and checkpoint is None:
            self._say(f"resume: no complete checkpoint of this run in {checkpoints.root}; "
                      f"starting from step 0")
        position = (checkpoints.resume(checkpoint, model, optimizer, claim.adopt_run_id)
                    if checkpoint is not None else None)
        codecs = codec_changes_since(checkpoint, self.math, log=self._say)
        if claim.adopt_run_id:  # the resumed checkpoint's run id (a new run's: open_records)
            self.records.set_identity(checkpoints.run_id, self.math)
        if claim.resuming:
            at = position or TrainerPosition(step=0, epoch=0, step_in_epoch=0, schedule={})
            self.records.log_resumed(at.step, str(checkpoint) if checkpoint else None, epoch=at.epoch,
                                     step_in_epoch=at.step_in_epoch, codec_changes=codecs)
        return position

    def abort_start(self, error: BaseException) -> BaseException:
        """Undo a start that failed with `error` (teardown.py: a new run's records removed, a
        resumed one's closed; where rank 0 was lost, by the rank that names it) and free the
        directory; the error every rank ends with (failure.py)."""
        failure = agreed_failure(error, 0, self.last_checkpoint)
        claim = self.claim
        undo_start(FailureRecords(self.records, self.mlperf), self.run_dir,
                   remove_records=self.rank == 0 and not claim.resuming)
        if writes_for_lost_rank0(failure, self.rank):  # rank 0 began the records: gone
            undo_start_of_lost_writer(
                self.run_dir, claim.run_id, self.lock, claim.resuming,
                lambda: opened_as_writer(self.cfg, claim.run_id), stop=(0, str(failure)))
        self.lock.release()  # refused or broken before training: free the directory
        return failure

    # ---- while it trains ------------------------------------------------------------
    def begin_steps(self, total: int) -> None:
        """Training starts; it stops at `total` or where every rank agrees to (stop.py)."""
        self._stops = StopAtLoggingSteps(total, self.cfg.logging.metrics_every_steps)

    def after_step(self, step: int) -> None:
        """Call after the step's logging all-reduce: RunInterrupted where every rank stops
        after `step` (this rank's or another rank's stop signal asked for it: stop.py)."""
        self._stop_if_asked(self._stops.after_step(step, stop_signal()), step)

    def during_eval(self, step: int) -> None:
        """A stop signal in an evaluation after `step`: a world of one stops at once; ranks
        ask for the stop after this evaluation (its gather is their meeting point: stop.py)
        and go on."""
        signum = stop_signal()
        if signum is not None and self.world_size == 1:
            raise self._interrupted(signum, step)
        if self._stops is not None:
            self._stops.during_pause(step, signum)

    def after_pause(self, step: int) -> None:
        """After an evaluation: RunInterrupted if a rank signalled during it asked to stop here."""
        self._stop_if_asked(self._stops.after_pause(step), step)

    def _stop_if_asked(self, request: Optional[dict], step: int) -> None:
        if request is not None:
            raise self._interrupted(request["exit_code"] - 128, step)

    def _interrupted(self, signum: int, step: int) -> RunInterrupted:
        return RunInterrupted(signum, interrupted_message(signum, step, self.last_checkpoint))

    def save_checkpoint(self, model: torch.nn.Module, optimizer, position: TrainerPosition) -> None:
        """Save; a failed save stops the run (CheckpointWriteError, on every rank), or with
        `checkpoint.on_error=warn` is reported and training goes on. A second stop signal
        during the save stops the run once it has ended (and is recorded)."""
        step = position.step
        with stop_signals_held(f"the checkpoint save of step {step}",
                               lambda: last_checkpoint_text(self.checkpointer.last_step)):
            try:
                path = self.checkpointer.save(model, optimizer, position)
            except CheckpointWriteError as e:
                if self.cfg.checkpoint.on_error != "warn":
                    raise
                self._say(f"warning: {e}; training on (checkpoint.on_error=warn)")
                self.records.log("checkpoint_failed", step=step, error=str(e))
                return
            self.records.log("checkpoint", step=step, path=str(path))

    # ---- stop ---------------------------------------------------------------------
    def stop(self, error: BaseException, run: RunProgress, epochs_done: float,
             samples: int) -> BaseException:
        """Close the records of a run that cannot go on after `error` (a `stopped` record, by
        rank 0 or by the rank that names a lost rank 0); the error every rank ends with
        (failure.py). Anything but a RunError is a bug: it is returned as it is."""
        error = as_run_stop(agreed_failure(error, run.completed, self.last_checkpoint))
        if not isinstance(error, RunError):
            return error
        records = FailureRecords(self.records, self.mlperf)
        if writes_for_lost_rank0(error, self.rank):  # rank 0 kept the records: gone
            records = records_of_lost_writer(
                self.run_dir, self.run_id, self.lock,
                lambda: opened_as_writer(self.cfg, self.run_id, self._reopened_mlperf_log)) or records
        records.stopped(run.completed, str(error), epochs_done, samples,
                        clock_running=run.clock_running)
        records.close()
        self.close()
        return error

    def _reopened_mlperf_log(self) -> Any:
        return self._open_mlperf_log(0, append=True)  # as rank 0 has it

    def close(self) -> None:
        """Close the records and release the run directory (safe to call twice)."""
        self.records.close()
        self.mlperf.close()
        self.lock.release()

    # ---- finish -----------------------------------------------------------------------
    def finish(self, step: int, tear_down: Callable[[], None]) -> int:
        """End a run that finished at `step` (its records closed): rank 0 says they are
        complete, then `tear_down` (the process group's final barrier). A peer lost in it
        after that is one line and changes nothing (no `stopped` record, exit 0); lost
        before that, it is a lost rank 0 as anywhere in the run. The exit code."""
        if self.rank == 0:  # its records are complete: a rank lost from here on changes nothing
            announce_finished()
        stop_heartbeat()  # a rank that is done is not silent
        try:
            tear_down()
        except Exception as e:  # noqa: BLE001 - a lost peer ends here; anything else is re-raised
            lost = peer_failure(e, step, self.last_checkpoint)
            if lost is None:
                raise
            if self.rank != 0 and not finished_announced():
                self._record_lost_writer(step, lost)
                end_rank(lost)
            print_once(f"dlrmtrain: {lost}; the run had finished and its records are complete",
                       lost.reporting_rank)
            sys.stdout.flush()
            os._exit(0)  # a peer is gone: the exit-time process-group teardown would abort
        return 0

    def _record_lost_writer(self, step: int, lost: RunError) -> None:
        """The `stopped` record of a run whose rank 0 was lost before its records were
        complete, by the rank that names it (teardown.py)."""
        if not writes_for_lost_rank0(lost, self.rank):
            return
        records = records_of_lost_writer(self.run_dir, self.run_id, RunLock(self.run_dir),
                                         lambda: opened_as_writer(self.cfg, self.run_id))
        if records is not None:
            records.stopped(step, str(lost), 0.0, 0, clock_running=False)
            records.close()


def end_rank(error: BaseException) -> NoReturn:
    """End a rank whose run stopped, or whose start every rank refused: its records are
    closed and its peers may be gone, so no teardown collective and no exit-time
    process-group teardown. One line, by the rank that names a lost peer (rank 0 may be the
    one lost), else by rank 0."""
    stop_heartbeat()
    print_once(str(error) if isinstance(error, RunInterrupted) else f"error: {error}",
               getattr(error, "reporting_rank", 0))
    sys.stdout.flush()
    os._exit(getattr(error, "exit_code", EXIT_USER_ERROR))
