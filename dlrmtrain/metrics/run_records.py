"""The run directory: resolved config, metrics as JSON lines, closing summary.

Only rank 0 writes; other ranks get a `NullRunRecords` with the same methods.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from dlrmtrain.config.loader import dump_config
from dlrmtrain.config.schema import Config


class RunRecords:
    def __init__(self, run_dir: Path, cfg: Config) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, run_dir / "config.yaml")
        self._metrics = open(run_dir / "metrics.jsonl", "w", buffering=1)

    def log(self, kind: str, **values: Any) -> None:
        """Append one JSON line: {"kind": ..., "time": ..., **values}."""
        self._metrics.write(json.dumps({"kind": kind, "time": time.time(), **values}) + "\n")

    def write_json(self, name: str, payload: dict[str, Any]) -> Path:
        path = self.run_dir / name
        path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.run_dir / name
        path.write_text(text)
        return path

    def close(self) -> None:
        self._metrics.close()


class NullRunRecords:
    """Stand-in on non-zero ranks: accepts every call, writes nothing."""

    run_dir = None

    def log(self, kind: str, **values: Any) -> None:
        pass

    def write_json(self, name: str, payload: dict[str, Any]) -> None:
        return None

    def write_text(self, name: str, text: str) -> None:
        return None

    def close(self) -> None:
        pass


def open_run_records(cfg: Config, rank: int) -> RunRecords | NullRunRecords:
    if rank != 0:
        return NullRunRecords()
    return RunRecords(Path(cfg.run.output_dir) / cfg.run.name, cfg)
