"""Checkpoints: sharded model, fused and dense optimizer state, schedule, data
position and RNG, saved atomically and verified before they are trusted.

Layout of one checkpoint, `<dir>/step_<N>/`:
  *.distcp, .metadata   torch.distributed.checkpoint (DCP) files: every rank
                        writes its own shards of the model and optimizer
  rng_rank<r>.pt        each rank's torch RNG state
  trainer_state.json    step, epoch, position in the epoch, LR-schedule state
  manifest.json         size and sha256 of every file above — written last
A checkpoint is written into `step_<N>.partial/` and renamed only after every
rank has finished and rank 0 has written the manifest; so a save interrupted
at any point leaves no `step_<N>/`. Loading re-checks the manifest: a file
that is missing, truncated or altered makes the checkpoint invalid, and the
previous one is used instead. (Assumes a filesystem all ranks share.)
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

_STEP_DIR = re.compile(r"^step_(\d+)$")
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"


@dataclass
class TrainerPosition:
    """Where training stands; enough to continue the same trajectory."""

    step: int
    epoch: int
    step_in_epoch: int
    schedule: dict[str, Any]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def verify_checkpoint(directory: Path) -> Optional[str]:
    """None when `directory` is a complete checkpoint, else why it is not."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return f"{directory}: no {MANIFEST} (the save did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        return f"{manifest_path}: unreadable ({e})"
    for rel, entry in manifest["files"].items():
        path = directory / rel
        if not path.is_file():
            return f"{path}: missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            return f"{path}: {size} bytes, manifest says {entry['bytes']} (truncated or altered)"
        if _sha256(path) != entry["sha256"]:
            return f"{path}: checksum differs from the manifest (corrupted)"
    return None


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


class Checkpointer:
    """Saves and restores the training state of one run (all ranks call every method)."""

    def __init__(self, root: Path, keep: int, rank: int, log=print) -> None:
        self.root = root
        self.keep = keep
        self.rank = rank
        self.log = log

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def save(self, model: torch.nn.Module, optimizer, position: TrainerPosition) -> Path:
        final = self.root / f"step_{position.step}"
        partial = self.root / f"step_{position.step}.partial"
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        self._barrier()
        dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()},
                 checkpoint_id=str(partial))
        torch.save(torch.get_rng_state(), partial / f"rng_rank{self.rank}.pt")
        self._barrier()  # every rank's files are on disk
        if self.rank == 0:
            (partial / TRAINER_STATE).write_text(json.dumps(vars(position), indent=2))
            files = {str(p.relative_to(partial)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                     for p in _files(partial)}
            (partial / MANIFEST).write_text(json.dumps({"step": position.step, "files": files},
                                                       indent=2))
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)  # the commit point
            for _, old in _step_dirs(self.root)[self.keep:]:
                shutil.rmtree(old, ignore_errors=True)
        self._barrier()
        return final

    def latest_valid(self) -> Optional[Path]:
        """The newest checkpoint that passes verification (decided on rank 0, shared)."""
        choice: list[Optional[str]] = [None]
        if self.rank == 0:
            for _, path in _step_dirs(self.root):
                problem = verify_checkpoint(path)
                if problem is None:
                    choice[0] = str(path)
                    break
                self.log(f"checkpoint rejected: {problem}; trying an older one")
        if dist.is_initialized():
            dist.broadcast_object_list(choice, src=0)
        return Path(choice[0]) if choice[0] else None

    def load(self, path: Path, model: torch.nn.Module, optimizer) -> TrainerPosition:
        state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        dcp.load(state, checkpoint_id=str(path))  # fills the tensors above in place
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        rng = path / f"rng_rank{self.rank}.pt"
        if rng.is_file():
            torch.set_rng_state(torch.load(rng))
        return TrainerPosition(**json.loads((path / TRAINER_STATE).read_text()))
