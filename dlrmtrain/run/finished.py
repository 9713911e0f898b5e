"""A run whose records are complete says so before its last collective (the teardown
barrier), so a rank lost there changes nothing.

Rank 0 (the records' writer) announces it once it has closed them: in the job's store,
for the ranks left in that barrier (they end in one line, exit 0, and write no `stopped`
record), and in a file its launcher named (`FINISHED_FILE_ENV`), so that the launcher,
seeing only a rank killed by a signal, exits 0 and says the run had finished. Without
the announcement (rank 0 lost before its records were complete) the barrier's failure is
a lost peer as anywhere else in the run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

FINISHED_FILE_ENV = "DLRMTRAIN_FINISHED_FILE"
"""The file rank 0 creates when the run's records are complete (set by launch.py)."""

_KEY = "dlrmtrain/finished"


def _key() -> str:
    # a job torchrun restarts keeps its store: a restart's run is not the last attempt's
    return f"{_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def announce_finished() -> None:
    """Say that the run's records are complete (rank 0, best effort)."""
    from dlrmtrain.run.stop import job_store_address, new_store_client

    marker = os.environ.get(FINISHED_FILE_ENV)
    if marker:
        try:
            Path(marker).touch()
        except OSError:  # the launcher then reports the killed rank as a failure
            pass
    address = job_store_address()
    if address is not None:
        try:
            new_store_client(address).set(_key(), "1")
        except Exception:  # noqa: BLE001 - the peers then see a lost peer
            pass


def finished_announced() -> bool:
    """Whether rank 0 said the run's records are complete (asked of the job's store)."""
    from dlrmtrain.run.stop import job_store_address, new_store_client

    address = job_store_address()
    if address is None:
        return False
    try:
        return new_store_client(address).check([_key()])
    except Exception:  # noqa: BLE001 - no store: nothing known
        return False


def finished_file_exists(path: Optional[str]) -> bool:
    """For the launcher: whether rank 0 created its `path` (FINISHED_FILE_ENV). The launcher
    imports this module before it checks its options and the config: the ranks' functions
    above import run/stop.py (torch.distributed) when they run, so that `dlrmtrain train`
    refuses bad options in a fraction of a second instead of after importing torch."""
    return bool(path) and Path(path).is_file()
