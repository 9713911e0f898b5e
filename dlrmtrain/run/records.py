"""A run's records in its directory: resolved config, metrics as JSON lines, summary,
plan and comm stats.

Only rank 0 writes; other ranks get a `NullRunRecords` with the same methods (when rank
0 is lost, the lowest rank left appends the `stopped` record in its place: teardown.py).
A record that cannot be written (a full disk, an I/O error) raises
`RecordWriteError` naming the file: a run never goes on with a silent gap in its
records. metrics.jsonl is line-buffered, so every record is on disk (in the OS's
hands) as soon as it is logged, and an interrupted run loses none.

A run killed in the middle of a write can leave a last line without its newline (a
torn line). Before a resumed run appends, `set_aside_torn_lines` moves such a line
into `<file>.torn-<n>` next to it (its bytes kept), so the next record starts a line
of its own instead of being glued onto the torn one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from dlrmtrain.config.loader import config_to_dict, dump_config
from dlrmtrain.config.schema import Config
from dlrmtrain.run.directory import RUN_FILE, RunClaim, run_dir_of
from dlrmtrain.run.errors import RecordWriteError
from dlrmtrain.run.identity import fingerprint

METRICS_FILE = "metrics.jsonl"
APPENDED_FILES = (METRICS_FILE, "mlperf.log")
"""The records a resumed run appends to (the others it writes whole)."""


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        raise RecordWriteError(f"cannot write the run's record {path}: "
                               f"{e.strerror or e}") from None


def _last_newline_end(f, size: int) -> int:
    """The offset just past the last b"\\n" of the open binary file `f` (0 if none)."""
    block = 1 << 16
    end = size
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        found = f.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


def set_aside_torn_line(path: Path) -> Optional[Path]:
    """Move a last line of `path` that lacks its newline into `<name>.torn-<n>` (the
    first free n) and cut it from `path`; the new file, or None when there was none.
    The bytes are written to their own file before `path` is cut, so a crash in
    between loses nothing (the next call sets the same line aside again)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    with _writing(path), open(path, "r+b") as f:
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        keep = _last_newline_end(f, size)
        f.seek(keep)
        torn = f.read()
        n = 1
        while (aside := path.with_name(f"{path.name}.torn-{n}")).exists():
            n += 1
        with _writing(aside):
            aside.write_bytes(torn)
        f.truncate(keep)
    return aside


def set_aside_torn_lines(run_dir: Path, log=print) -> list[Path]:
    """`set_aside_torn_line` for every record a resumed run appends to, saying so."""
    moved = []
    for name in APPENDED_FILES:
        aside = set_aside_torn_line(run_dir / name)
        if aside is not None:
            log(f"resume: the last line of {run_dir / name} was torn (a run stopped mid-write): "
                f"its {aside.stat().st_size} bytes set aside in {aside.name}, before appending")
            moved.append(aside)
    return moved


class StrictFileHandler(logging.FileHandler):
    """A logging handler for a record file (mlperf.log): a failed write raises
    RecordWriteError. The stock handler prints "--- Logging error ---" and goes on,
    which would leave a silent gap in the record."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        error = sys.exc_info()[1]
        reason = getattr(error, "strerror", None) or error
        raise RecordWriteError(f"cannot write the run's record {self.baseFilename}: {reason}")

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # the last write failed and was raised already; the file is closed
            pass


class RunRecords:
    def __init__(self, run_dir: Path, cfg: Config, claim: RunClaim) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        run_dir.mkdir(parents=True, exist_ok=True)
        if not claim.resuming:  # a resumed run keeps the config it started with
            with _writing(run_dir / "config.yaml"):
                dump_config(cfg, run_dir / "config.yaml")
        self._metrics_path = run_dir / METRICS_FILE
        with _writing(self._metrics_path):
            self._metrics = open(self._metrics_path, "a" if claim.resuming else "w", buffering=1)

    def set_identity(self, run_id: str, math: dict[str, Any]) -> None:
        self.write_json(RUN_FILE, {"run_id": run_id, "config_fingerprint": fingerprint(math),
                                   "started": time.time()})

    def log_resumed(self, step: int, checkpoint: Optional[str], **position: Any) -> None:
        """The marker between a run's records before and after a restart."""
        self.log("resumed", step=step, checkpoint=checkpoint, **position,
                 config=config_to_dict(self.cfg))

    def log(self, kind: str, **values: Any) -> None:
        """Append one JSON line: {"kind": ..., "time": ..., **values}."""
        with _writing(self._metrics_path):
            self._metrics.write(json.dumps({"kind": kind, "time": time.time(), **values}) + "\n")

    def write_json(self, name: str, payload: dict[str, Any]) -> Path:
        return self.write_text(name, json.dumps(payload, indent=2, sort_keys=False) + "\n")

    def write_text(self, name: str, text: str) -> Path:
        """Write `name` whole or not at all: a crash mid-write leaves the old file."""
        path = self.run_dir / name
        tmp = path.with_name(f".{name}.tmp-{os.getpid()}")
        with _writing(path):
            tmp.write_text(text)
            os.replace(tmp, path)
        return path

    def close(self) -> None:
        if self._metrics.closed:
            return
        try:
            self._metrics.close()
        except OSError:  # its last line failed already and was reported; closing still frees it
            pass


class NullRunRecords:
    """Stand-in on non-zero ranks: accepts every call, writes nothing."""

    run_dir = None

    def set_identity(self, run_id: str, math: dict[str, Any]) -> None:
        pass

    def log_resumed(self, step: int, checkpoint: Optional[str], **position: Any) -> None:
        pass

    def log(self, kind: str, **values: Any) -> None:
        pass

    def write_json(self, name: str, payload: dict[str, Any]) -> None:
        return None

    def write_text(self, name: str, text: str) -> None:
        return None

    def close(self) -> None:
        pass


def open_run_records(cfg: Config, rank: int, claim: RunClaim) -> RunRecords | NullRunRecords:
    if rank != 0:
        return NullRunRecords()
    return RunRecords(run_dir_of(cfg), cfg, claim)
