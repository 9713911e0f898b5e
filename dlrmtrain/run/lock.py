"""One run per directory at a time (and one writer per dataset directory).

Rank 0 holds an exclusive `flock` on `<run dir>/run.lock` from before it looks at
the directory until the process ends. The kernel drops the lock when its holder
dies (even by kill -9), so a lock file left by a dead run never blocks the next
one; a live holder is named (host, pid, start time) in the refusal. flock, not
POSIX `lockf`: closing any other descriptor of the file would silently release a
POSIX lock. (On NFS, Linux maps flock to the server's byte-range locks.)
`dlrmtrain preprocess` holds the same kind of lock on its `--out` (`preprocess.lock`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Optional

from dlrmtrain.run.errors import SetupError

LOCK_FILE = "run.lock"
PREPROCESS_LOCK_FILE = "preprocess.lock"


class RunLock:
    """The lock of one run directory; `acquire` or raise SetupError naming the holder.
    `user` and `advice` word the refusal for another kind of writer (preprocess)."""

    def __init__(self, run_dir: Path, name: str = LOCK_FILE, user: str = "another run",
                 advice: str = "choose another run.name") -> None:
        self.path = run_dir / name
        self.user, self.advice = user, advice
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SetupError(f"{self.path.parent} is in use by {self.user} "
                             f"({describe_holder(self.path)}); wait for it to end, or "
                             f"{self.advice}") from None
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None


def describe_holder(path: Path) -> str:
    """`host H, pid P, started YYYY-MM-DD HH:MM:SS UTC` from a lock file."""
    try:
        holder = json.loads(path.read_text())
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder["started"]))
        return f"host {holder['host']}, pid {holder['pid']}, started {started}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"holder not recorded yet in {path}"
