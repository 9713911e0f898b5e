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
starts from step 0 as before. A resume whose checkpoint already is at the planned last
step is `RunAlreadyFinished` too (`refuse_finished_checkpoint`), and so is one of a run
whose summary.json says it reached its target AUC (the same target, or a lower one:
`refuse_run_at_target`), whatever checkpoint it kept. A resume that loads one
says which lossless codec changes it trains on under (`codec_changes_since`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Optional

from dlrmtrain.run.checkpoint import TRAINER_STATE, read_manifest
from dlrmtrain.run.directory import RECORD_FILES, run_dir_of
from dlrmtrain.run.errors import RunAlreadyFinished, SetupError
from dlrmtrain.run.identity import lossless_codec_changes
from dlrmtrain.run.rank0 import decide_on_rank0


class ResumeWithoutCheckpoint(SetupError):
    """checkpoint.resume=true in a directory holding records, and no checkpoint to load."""


def _summary(run_dir: Path) -> Optional[dict[str, Any]]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return summary if isinstance(summary, dict) else None


def _reached_target(summary: dict[str, Any], target_auc: Optional[float]) -> bool:
    """Whether the run of `summary` reached `target_auc` (a target no higher than its own)."""
    reached_at = summary.get("target_auc")
    return bool(summary.get("reached_target")) and (
        target_auc is None or not isinstance(reached_at, (int, float)) or target_auc <= reached_at)


def refuse_run_at_target(run_dir: Path, target_auc: Optional[float]) -> None:
    """A resume of a run that reached its target AUC (summary.json) stops before any record
    is opened, whatever checkpoint it kept: training on would go past the run's end."""
    summary = _summary(run_dir) or {}
    if _reached_target(summary, target_auc):
        raise RunAlreadyFinished(
            f"{run_dir} already finished: its summary.json records that it reached its target "
            f"AUC {summary.get('target_auc')} at step {summary.get('steps')}; nothing trained, "
            f"every record left as it was. Raise eval.target_auc to train on.")


def refuse_resume_without_checkpoint(run_dir: Path, checkpoint_dir: Path, rejected: list[str],
                                     planned_steps: int, target_auc: Optional[float]) -> None:
    """Raise what a resume of the run in `run_dir` (which holds records) does when no
    checkpoint in `checkpoint_dir` could be loaded (`rejected`: why each one was not)."""
    records = [name for name in RECORD_FILES if (run_dir / name).exists()]
    found = ("; ".join(rejected) if rejected
             else f"{checkpoint_dir} holds no checkpoint")
    summary = _summary(run_dir) or {}
    steps = summary.get("steps")
    at_target = _reached_target(summary, target_auc)
    if isinstance(steps, int) and (steps >= planned_steps or at_target):
        reached = " (it reached its target AUC)" if at_target else ""
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


def refuse_finished_checkpoint(run_dir: Path, checkpoint: Path, planned_steps: int) -> None:
    """A resume whose `checkpoint` already is at the planned last step stops before any
    record is opened: a second summary of zero steps would replace the first."""
    step = json.loads((checkpoint / TRAINER_STATE).read_text())["step"]
    if step >= planned_steps:
        raise RunAlreadyFinished(
            f"{run_dir} already finished: its checkpoint {checkpoint.name} "
            f"is at step {step}, the planned last step is {planned_steps}; nothing trained, "
            f"every record left as it was. Raise run.max_steps or run.epochs to train on.")


def refuse_what_cannot_resume(cfg: Any, resuming: bool, checkpoint: Optional[Path], checkpointer: Any,
                              planned_steps: int, rank: int) -> None:
    """A resume with nothing to train, or no checkpoint for its records, stops here, on every
    rank alike (rank 0 reads the records and decides)."""
    run_dir = run_dir_of(cfg)
    if checkpoint is not None:
        refuse_finished_checkpoint(run_dir, checkpoint, planned_steps)
        if resuming:
            decide_on_rank0(lambda: refuse_run_at_target(run_dir, cfg.eval.target_auc), rank)
    elif cfg.checkpoint.resume and resuming:
        decide_on_rank0(lambda: refuse_resume_without_checkpoint(
            run_dir, checkpointer.root, checkpointer.rejected, planned_steps, cfg.eval.target_auc), rank)


def codec_changes_since(checkpoint: Optional[Path], math: dict[str, Any],
                        log: Callable[[str], None]) -> dict[str, list]:
    """`key: [checkpoint's, now]` of each lossless codec change since `checkpoint` (allowed:
    the same model trains on), each said once with `log`; empty without a checkpoint or a
    manifest that says."""
    saved = (read_manifest(checkpoint) or {}).get("math_config") if checkpoint is not None else None
    changes = {k: [a, b] for k, a, b in lossless_codec_changes(saved, math)} if saved else {}
    for key, (before, now) in changes.items():
        log(f"resume: {key} {before} → {now} (lossless both: the same model trains on)")
    return changes
