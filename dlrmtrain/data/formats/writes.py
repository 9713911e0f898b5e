"""Writes of output files that leave nothing behind when they fail, and say what failed.

A file is written under `<name>.tmp` and renamed into place when complete; on any
failure the temporary file is removed (a half-written vocabulary would otherwise keep
a full disk full). An `OSError` while writing (a full disk, an I/O error, a quota)
becomes one `OutputWriteError` line naming the file, the bytes written so far, the
bytes expected and the space free there.
"""

from __future__ import annotations

import errno as errno_codes
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from dlrmtrain.run.console import human_bytes
from dlrmtrain.run.errors import SetupError


class NotEnoughSpace(SetupError):
    """The output's file system has less free space than the output needs (refused before
    anything is written)."""


class OutputWriteError(OSError):
    """An output file could not be written; the message names it and the sizes."""

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)  # one argument: str() is the message alone, no "[Errno 28]"
        self.errno = code


def free_bytes_at(path: str | Path) -> int:
    """Free bytes on the file system that holds `path` (or would: its nearest existing folder)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def check_free_space(out: Path, needed: int, detail: str, advice: str,
                     reclaimed: int = 0) -> None:
    """Refuse, before anything is written, when `out`'s file system cannot take `needed`
    bytes (`reclaimed`: bytes of old output the write replaces)."""
    free = free_bytes_at(out)
    if free + reclaimed < needed:
        raise NotEnoughSpace(
            f"{out} needs about {human_bytes(needed)} ({detail}) but its file system has "
            f"{human_bytes(free)} free" + (f" (+{human_bytes(reclaimed)} it would replace)" if reclaimed else "")
            + f": {advice} (nothing was written)")


def write_failed(path: Path, error: OSError, written: int, expected: Optional[int],
                 removed: str = "") -> OutputWriteError:
    """The one-line error for a failed write of `path` (`removed`: what was cleaned up)."""
    reason = error.strerror or str(error)
    if error.errno == errno_codes.ENOSPC:
        reason = "no space left on device"
    try:
        free = f"; {human_bytes(free_bytes_at(path))} free there"
    except OSError:
        free = ""
    of = f" of about {human_bytes(expected)} expected" if expected else ""
    return OutputWriteError(f"could not write {path} ({reason}) after {human_bytes(written)}{of}{free}"
                            + (f"; removed {removed}" if removed else ""), error.errno)


@contextmanager
def atomic_output(path: Path, expected_bytes: Optional[int] = None) -> Iterator[Path]:
    """Yield the temporary path to write; rename it to `path` on success, remove it on failure."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as e:
        written = tmp.stat().st_size if tmp.exists() else 0
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, OutputWriteError):
            raise write_failed(path, e, written, expected_bytes, removed=tmp.name) from None
        raise


def save_npz(path: Path, expected_bytes: Optional[int] = None, **arrays: np.ndarray) -> None:
    """`np.savez` to `path`, atomically. Through an open file, so numpy appends no `.npz` to
    the temporary name (which then escaped the cleanup as `<name>.tmp.npz`)."""
    with atomic_output(path, expected_bytes) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())  # a full disk found at close must fail here, not after the rename
