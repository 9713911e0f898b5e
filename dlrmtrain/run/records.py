"""A run's records in its directory: resolved config, metrics as JSON lines, summary,
plan and comm stats.

Only rank 0 writes; other ranks get a `NullRunRecords` with the same methods.
A record that cannot be written (a full disk, an I/O error) raises
`RecordWriteError` naming the file: a run never goes on with a silent gap in its
records. metrics.jsonl is line-buffered, so every record is on disk (in the OS's
hands) as soon as it is logged, and an interrupted run loses none.
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


@contextmanager
def _writing(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as e:
        raise RecordWriteError(f"cannot write the run's record {path}: "
                               f"{e.strerror or e}") from None


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
