"""How the ranks of a job stop together, and tell each other why.

A stop signal may reach one rank alone (a scheduler, `kill`), or every rank at slightly
different steps (torchrun forwards it). On NCCL a rank that leaves on its own does not
fail its peers' next collective: they hang in it until the watchdog aborts them. So a
signalled rank does not leave at once: it asks, in the job's rendezvous store (the one
torchrun's agent keeps, at MASTER_ADDR:MASTER_PORT), for the stop at the next logging
step ahead of it, and trains on to it. Every rank reads the store at its logging steps,
after the step's logging all-reduce: a rank that asked did so before it joined that
all-reduce, so every rank sees the request there at the latest, and all stop after the
same step. The first request of a job wins (later ones adopt it). One store round trip
per logging step while the run is healthy.

A rank that stops for another reason (a record it cannot write) cannot train on: it
leaves its message and exit code in the store before it exits; a rank whose step then
fails reads it and ends the same way, without a traceback.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Optional

import torch.distributed as dist

from dlrmtrain.run.parent import parent_gone

_STOPPED = "dlrmtrain/stopped"
_REQUEST = "dlrmtrain/stop_request"
_stores: dict[tuple[str, int], dist.Store] = {}


def _key(name: str) -> str:
    # a job torchrun restarts keeps its store: a restart must not read the last attempt's stop
    return f"{name}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def job_store_address() -> Optional[tuple[str, int]]:
    """(host, port) of the job's store, or None for a world of one or when the store is
    known to be gone: under torchrun it lives in the rank's launcher (its agent), and a
    client that talks to a dead store prints ~25 lines of C++ frames per call before it
    raises, so nothing asks it once the launcher has died."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port or int(os.environ.get("WORLD_SIZE", "1")) <= 1 or parent_gone():
        return None
    return addr, int(port)


def new_store_client(address: tuple[str, int]) -> dist.Store:
    """A client of the job's store that waits at most 5 s for an answer."""
    return dist.TCPStore(address[0], address[1], is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=5))


def _job_store() -> Optional[dist.Store]:
    """The job's store (one client per process: each logging step reads it), or None."""
    address = job_store_address()
    if address is None:
        return None
    if address not in _stores:
        _stores[address] = new_store_client(address)
    return _stores[address]


def announce_stop(message: str, exit_code: int) -> None:
    """Leave `message` for the other ranks (best effort: the store may be gone)."""
    try:
        store = _job_store()
        if store is not None:
            store.set(_key(_STOPPED), json.dumps({"message": message, "exit_code": exit_code,
                                                  "rank": int(os.environ.get("RANK", "0"))}))
    except Exception:  # noqa: BLE001 - the peers then see a plain failure
        pass


def _read(name: str) -> Optional[dict]:
    try:
        store = _job_store()
        if store is None or not store.check([_key(name)]):
            return None
        return json.loads(store.get(_key(name)))
    except Exception:  # noqa: BLE001 - no store (the agent is gone): nothing there
        return None


def announced_stop() -> Optional[dict]:
    """{"message", "exit_code", "rank"} if another rank stopped the job on purpose."""
    return _read(_STOPPED)


def request_stop(exit_code: int, stop_at: int) -> dict:
    """Ask every rank to stop after step `stop_at`; returns the job's request: this one,
    or an earlier rank's (the first wins). Without a store it stands alone."""
    request = {"exit_code": exit_code, "stop_at": stop_at, "rank": int(os.environ.get("RANK", "0"))}
    try:
        store = _job_store()
        if store is not None:
            return json.loads(store.compare_set(_key(_REQUEST), "", json.dumps(request)))
    except Exception:  # noqa: BLE001 - no store: this rank stops at stop_at by itself
        pass
    return request


def requested_stop() -> Optional[dict]:
    """{"exit_code", "stop_at", "rank"} if a rank of the job asked for the stop."""
    return _read(_REQUEST)


class StopAtLoggingSteps:
    """One run's stop on every rank at the same logging step (the module docstring)."""

    def __init__(self, total: int, every: int) -> None:
        self.total, self.every = total, max(1, every)
        self.request: Optional[dict] = None  # this rank's (or the job's) request

    def is_logging_step(self, step: int) -> bool:
        return step % self.every == 0 or step >= self.total

    def after_step(self, step: int, signum: Optional[int]) -> Optional[dict]:
        """The job's stop request if the run stops after `step`, else None. Call after the
        step's logging all-reduce, with the stop signal this rank got (if any). A signal
        at the planned last step asks for nothing: the run ends there anyway."""
        if signum is not None and self.request is None and step < self.total:
            stop_at = min((step // self.every + 1) * self.every, self.total)  # the next one ahead
            self.request = request_stop(128 + signum, stop_at)
        if not self.is_logging_step(step):
            return None
        return self._due(step)

    def during_pause(self, step: int, signum: Optional[int]) -> None:
        """A stop signal during an evaluation (or a checkpoint) after `step`: ask for the stop
        right after it, so no rank trains a further step. The ranks meet at the evaluation's
        gather, which the asking rank joins after it asked: `after_pause` then sees it."""
        if signum is not None and self.request is None:
            self.request = request_stop(128 + signum, step)

    def after_pause(self, step: int) -> Optional[dict]:
        """The job's stop request if it asks for the stop at `step`, read after the pause's
        collectives (one store round trip per evaluation), else None."""
        return self._due(step)

    def _due(self, step: int) -> Optional[dict]:
        request = requested_stop() or self.request
        return request if request is not None and step >= request["stop_at"] else None
