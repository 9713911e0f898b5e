"""A rank that stops the job on purpose tells the others why.

When one rank stops (a signal sent to it alone, a record it cannot write), its
peers learn of it only as a failed collective. Before it exits, the stopping rank
leaves its message and exit code in the job's rendezvous store (the one torchrun's
agent keeps, at MASTER_ADDR:MASTER_PORT); a rank whose step then fails reads it
and ends the same way, without a traceback. Nothing is read or written here while
the run is healthy.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Optional

import torch.distributed as dist

_KEY = "dlrmtrain/stopped"


def _job_store() -> Optional[dist.Store]:
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return dist.TCPStore(addr, int(port), is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=5))


def announce_stop(message: str, exit_code: int) -> None:
    """Leave `message` for the other ranks (best effort: the store may be gone)."""
    try:
        store = _job_store()
        if store is not None:
            store.set(_KEY, json.dumps({"message": message, "exit_code": exit_code,
                                        "rank": int(os.environ.get("RANK", "0"))}))
    except Exception:  # noqa: BLE001 - the peers then see a plain failure
        pass


def announced_stop() -> Optional[dict]:
    """{"message", "exit_code", "rank"} if another rank stopped the job on purpose."""
    try:
        store = _job_store()
        if store is None or not store.check([_KEY]):
            return None
        return json.loads(store.get(_KEY))
    except Exception:  # noqa: BLE001 - no store (the agent is gone): nothing announced
        return None
