"""The run directory and the checkpoint directory: where they are and whose they are.

A run directory holds one run. `claim_run_dir` (rank 0, before anything is
written) first takes the directory's lock (lock.py: a second live run is refused),
then decides whose it is:
  - a new run refuses a directory (or checkpoint directory) that holds another
    run, unless `run.overwrite=true`, which first removes that run's records and
    checkpoints, so no stale file (e.g. comm_stats.json) outlives it;
  - a resumed run (`checkpoint.resume=true`) keeps the run's id and appends to
    its records, marking where it resumed.
Both directories are checked for writing at start, not at the first save.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dlrmtrain.config.schema import Config
from dlrmtrain.run.errors import SetupError
from dlrmtrain.run.identity import new_run_id
from dlrmtrain.run.lock import RunLock

RUN_FILE = "run.json"  # {"run_id", "config_fingerprint", "started"}
# Everything a run writes into its directory (removed by run.overwrite=true).
RECORD_FILES = (RUN_FILE, "config.yaml", "metrics.jsonl", "mlperf.log", "summary.json",
                "plan.txt", "comm_stats.json", "step_breakdown.json")
TORN_LINES = "*.torn-*"
"""Torn last lines a resume set aside (records.set_aside_torn_line): the run's too."""
_CHECKPOINT_ENTRY = re.compile(r"^step_\d+(\.partial)?$")


@dataclass(frozen=True)
class RunClaim:
    run_id: str
    resuming: bool      # the run directory already holds this run: append to its records
    adopt_run_id: bool  # no run.json yet: a resumed checkpoint's run id replaces run_id


def run_dir_of(cfg: Config) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


def checkpoint_dir_of(cfg: Config) -> Path:
    return Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else run_dir_of(cfg) / "checkpoints"


def _check_writable(directory: Path, key: str) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise SetupError(f"{key}: cannot write to {directory} ({e.strerror or e})") from None


def claim_run_dir(cfg: Config, lock: RunLock) -> RunClaim:
    """Lock, check, and if asked clear, the run and checkpoint directories (rank 0 only).
    The caller keeps `lock` held until the run ends."""
    run_dir, ckpt_dir = run_dir_of(cfg), checkpoint_dir_of(cfg)
    _check_writable(run_dir, "run.output_dir / run.name")
    lock.acquire()
    try:
        return _claim_locked(cfg, run_dir, ckpt_dir)
    except BaseException:
        lock.release()  # refused: the directory is free again
        raise


def _claim_locked(cfg: Config, run_dir: Path, ckpt_dir: Path) -> RunClaim:
    _check_writable(ckpt_dir, "checkpoint.dir")
    records = [run_dir / n for n in RECORD_FILES if (run_dir / n).exists()]
    records += sorted(run_dir.glob(TORN_LINES))
    checkpoints = sorted(p for p in ckpt_dir.iterdir() if _CHECKPOINT_ENTRY.match(p.name))
    if cfg.checkpoint.resume:
        identity = read_identity(run_dir)
        if identity is not None:
            return RunClaim(identity["run_id"], resuming=True, adopt_run_id=False)
        return RunClaim(new_run_id(), resuming=bool(records), adopt_run_id=True)
    if records or checkpoints:
        if not cfg.run.overwrite:
            found = [p.name for p in records] + ([f"{len(checkpoints)} checkpoint(s) in "
                                                  f"{ckpt_dir}"] if checkpoints else [])
            raise SetupError(
                f"{run_dir} already holds a run ({', '.join(found)}); set "
                f"checkpoint.resume=true to continue it, run.overwrite=true to replace it, "
                f"or choose another run.name")
        for path in records:
            path.unlink()
        for path in checkpoints:
            shutil.rmtree(path)
    return RunClaim(new_run_id(), resuming=False, adopt_run_id=False)


def read_identity(run_dir: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
