"""A resume that finds no checkpoint it can load, in a run directory that holds records.

Starting such a run again from step 0 would append a second trajectory to its
metrics.jsonl and mlperf.log and replace its summary.json (an MLPerf log with two
sessions fails the compliance check). So (rank 0 decides, before any record is
opened):
  - a run whose summary.json says it finished (at its planned last step, or at its
    target AUC) has nothing to train: `RunAlreadyFinished`, exit 0, nothing written;
  - any other is refused (`ResumeWithoutCheckpoint`, exit 2, nothing written), naming
    every checkpoint that was passed over and why, and how to start afresh.
A resume into a directory without records (a first start with checkpoint.resume=true)
starts from step 0 as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from dlrmtrain.run.directory import RECORD_FILES
from dlrmtrain.run.errors import RunAlreadyFinished, SetupError


class ResumeWithoutCheckpoint(SetupError):
    """checkpoint.resume=true in a directory holding records, and no checkpoint to load."""


def _summary(run_dir: Path) -> Optional[dict[str, Any]]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return summary if isinstance(summary, dict) else None


def refuse_resume_without_checkpoint(run_dir: Path, checkpoint_dir: Path, rejected: list[str],
                                     planned_steps: int) -> None:
    """Raise what a resume of the run in `run_dir` (which holds records) does when no
    checkpoint in `checkpoint_dir` could be loaded (`rejected`: why each one was not)."""
    records = [name for name in RECORD_FILES if (run_dir / name).exists()]
    found = ("; ".join(rejected) if rejected
             else f"{checkpoint_dir} holds no checkpoint")
    summary = _summary(run_dir) or {}
    steps = summary.get("steps")
    if isinstance(steps, int) and (steps >= planned_steps or summary.get("reached_target")):
        reached = " (it reached its target AUC)" if summary.get("reached_target") else ""
        raise RunAlreadyFinished(
            f"{run_dir} already finished: its summary.json records {steps} steps{reached}, the "
            f"planned last step is {planned_steps}, and no checkpoint to train on from "
            f"({found}); nothing trained, every record left as it was.")
    ended = (f"it finished at step {steps} (summary.json), the planned last step is "
             f"{planned_steps}; " if isinstance(steps, int) else "")
    raise ResumeWithoutCheckpoint(
        f"cannot resume {run_dir}: {ended}no usable checkpoint ({found}), and starting again from "
        f"step 0 would add a second trajectory to its records ({', '.join(records)}); nothing "
        f"was written. To start afresh, use another run.name, or checkpoint.resume=false "
        f"with run.overwrite=true (removes this run's records and checkpoints).")
