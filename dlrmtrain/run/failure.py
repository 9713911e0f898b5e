"""Which error a rank ends with when its run cannot go on: the same on every rank.

A rank that decided (a SetupError or RunError of its own) leaves it in the job's store
for the others (run/stop.py); a rank whose collective then broke reads it there and ends
the same way. A collective that broke because a peer is gone or does not answer is a
PeerFailure naming it (run/peers.py), also after the stop signal torchrun sends when it
sees a rank die. An error after a stop signal is the interruption. Anything else is a
bug and is returned as it is (it keeps its traceback).
"""

from __future__ import annotations

from typing import Optional

from dlrmtrain.run.errors import (EXIT_USER_ERROR, RunAlreadyFinished, RunError,
                                  RunInterrupted, SetupError, signal_name)
from dlrmtrain.run.parent import PARENT_DEATH_SIGNAL, parent_gone
from dlrmtrain.run.peers import peer_failure
from dlrmtrain.run.signals import stop_signal
from dlrmtrain.run.stop import announce_stop, announced_stop


def last_checkpoint_text(step: Optional[int]) -> str:
    """Where a stopped run can resume: `last checkpoint step N`, or `... none`."""
    return "last checkpoint " + (f"step {step}" if step is not None else "none")


def interrupted_message(signum: int, step: int, last_checkpoint: Optional[int]) -> str:
    """What a run stopped by `signum` at `step` says: the signal, and where it can resume."""
    why = " (its launcher died)" if parent_gone() else ""
    return (f"interrupted by {signal_name(signum)}{why} at step {step}; "
            + last_checkpoint_text(last_checkpoint))


def _adopted(announced: dict) -> BaseException:
    """The error a peer announced (it stopped first, and that broke our collective)."""
    code = announced["exit_code"]
    if code == EXIT_USER_ERROR:
        return SetupError(announced["message"])
    stop = (RunInterrupted(code - 128, announced["message"]) if code > 128
            else RunError(announced["message"]))
    stop.exit_code = code
    return stop


def agreed_failure(error: BaseException, step: int,
                   last_checkpoint: Optional[int]) -> BaseException:
    """The error this rank ends with after `error` at `step` (the module docstring)."""
    # the job's store lives in the launcher: once that is dead, asking it only waits
    store_alive = not parent_gone()
    if not store_alive and not isinstance(error, RunInterrupted):  # whatever broke after
        return RunInterrupted(PARENT_DEATH_SIGNAL,
                              interrupted_message(PARENT_DEATH_SIGNAL, step, last_checkpoint))
    if isinstance(error, (SetupError, RunError)):
        if store_alive and not isinstance(error, RunAlreadyFinished):
            announce_stop(str(error), getattr(error, "exit_code", EXIT_USER_ERROR))
        return error
    announced = announced_stop() if store_alive else None
    if announced is not None:
        return _adopted(announced)
    lost = peer_failure(error, step, last_checkpoint)
    if lost is not None:  # a peer died, froze or timed out: named, and told to the others
        announce_stop(str(lost), lost.exit_code)
        return lost
    signum = stop_signal()
    if signum is not None:
        return RunInterrupted(signum, interrupted_message(signum, step, last_checkpoint))
    return error


def as_run_stop(error: BaseException) -> BaseException:
    """`error` as a run that trained ends with it: a SetupError there is a peer that refused
    the start this rank got past, so a RunError with the user-error exit code."""
    if not isinstance(error, SetupError):
        return error
    refused = RunError(str(error))
    refused.exit_code = EXIT_USER_ERROR
    return refused
