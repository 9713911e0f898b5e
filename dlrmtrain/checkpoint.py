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

A checkpoint belongs to one run: its manifest holds the run id and the
math-changing config (run_identity.py). Retention deletes only this run's
older valid checkpoints; resume takes only this run's and refuses one whose
math-changing config differs, naming the keys. A `step_<N>.partial/` holds an
owner file (host, pid) so the next start can remove those left by dead processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from dlrmtrain.errors import SetupError
from dlrmtrain.leftovers import process_alive
from dlrmtrain.run_identity import differing_keys, fingerprint

_STEP_DIR = re.compile(r"^step_(\d+)$")
_PARTIAL_DIR = re.compile(r"^step_(\d+)\.partial$")
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"
OWNER = "owner.json"  # in a .partial folder only: the process writing it


class ResumeRefused(SetupError):
    """The checkpoint to resume from was trained with a different math-changing config."""


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
    return sorted(p for p in directory.rglob("*")
                  if p.is_file() and p.name not in (MANIFEST, OWNER))


def read_manifest(directory: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads((directory / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None


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


def remove_dead_partials(root: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Delete `step_<N>.partial/` folders whose writer is no longer alive on this host
    (or that name no writer). A partial written from another host is left alone."""
    removed = []
    if not root.is_dir():
        return removed
    for path in sorted(root.iterdir()):
        if not _PARTIAL_DIR.match(path.name):
            continue
        try:
            owner = json.loads((path / OWNER).read_text())
        except (OSError, json.JSONDecodeError):
            owner = None
        if owner is not None and owner.get("host") != socket.gethostname():
            log(f"leaving {path}: written from host {owner.get('host')}, cannot tell if alive")
            continue
        if owner is not None and process_alive(int(owner.get("pid", -1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        log(f"removed {path}: an interrupted save (its writer is gone)")
        removed.append(path)
    return removed


class Checkpointer:
    """Saves and restores the training state of one run (all ranks call every method)."""

    def __init__(self, root: Path, keep: int, rank: int, run_id: str,
                 math: dict[str, Any], log=print) -> None:
        self.root = root
        self.keep = keep
        self.rank = rank
        self.run_id = run_id  # may be replaced by the resumed checkpoint's (Trainer)
        self.math = math
        self.log = log
        self._verified: set[Path] = set()  # checked (or written) by this process: valid

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def save(self, model: torch.nn.Module, optimizer, position: TrainerPosition) -> Path:
        final = self.root / f"step_{position.step}"
        partial = self.root / f"step_{position.step}.partial"
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            (partial / OWNER).write_text(json.dumps({"host": socket.gethostname(),
                                                     "pid": os.getpid()}))
        self._barrier()
        dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()},
                 checkpoint_id=str(partial))
        torch.save(torch.get_rng_state(), partial / f"rng_rank{self.rank}.pt")
        self._barrier()  # every rank's files are on disk
        if self.rank == 0:
            (partial / TRAINER_STATE).write_text(json.dumps(vars(position), indent=2))
            files = {str(p.relative_to(partial)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
                     for p in _files(partial)}
            manifest = {"step": position.step, "run_id": self.run_id,
                        "config_fingerprint": fingerprint(self.math), "math_config": self.math,
                        "files": files}
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=2))
            (partial / OWNER).unlink()
            shutil.rmtree(final, ignore_errors=True)
            partial.rename(final)  # the commit point
            self._verified.add(final)
            self._apply_retention()
        self._barrier()
        return final

    def _apply_retention(self) -> None:
        """Keep this run's `keep` newest valid checkpoints; never touch another run's,
        and never let an invalid one take a valid one's place."""
        valid = []
        for _, path in _step_dirs(self.root):
            manifest = read_manifest(path)
            if manifest is None or manifest.get("run_id") != self.run_id:
                continue
            if path not in self._verified:
                if verify_checkpoint(path) is not None:
                    continue
                self._verified.add(path)
            valid.append(path)
        for old in valid[self.keep:]:
            shutil.rmtree(old, ignore_errors=True)
            self._verified.discard(old)

    def latest_valid(self, any_run: bool = False) -> Optional[Path]:
        """The newest checkpoint of this run (of any run with `any_run`) that passes
        verification and was trained with the same math-changing config; decided on
        rank 0, shared. Raises ResumeRefused, on every rank, when that config differs."""
        choice: list[Optional[str]] = [None, None]  # path, refusal
        if self.rank == 0:
            choice = self._choose_latest(any_run)
        if dist.is_initialized():
            dist.broadcast_object_list(choice, src=0)
        if choice[1] is not None:
            raise ResumeRefused(choice[1])
        return Path(choice[0]) if choice[0] else None

    def _choose_latest(self, any_run: bool) -> list[Optional[str]]:
        for _, path in _step_dirs(self.root):
            problem = verify_checkpoint(path)
            if problem is not None:
                self.log(f"checkpoint rejected: {problem}; trying an older one")
                continue
            manifest = read_manifest(path) or {}
            owner = manifest.get("run_id")
            if not any_run and owner != self.run_id:
                self.log(f"checkpoint skipped: {path} belongs to run {owner}, "
                         f"not this run {self.run_id}")
                continue
            saved = manifest.get("math_config")
            if saved is None:
                return [None, f"{path}: the manifest records no config (an older dlrmtrain "
                              f"wrote it); cannot check that resuming it is safe"]
            diff = differing_keys(saved, self.math)
            if diff:
                return [None, f"{path} was trained with a different config; resuming it "
                              f"would change the math. Differing keys: " + "; ".join(diff)
                        + ". Use the original values, or start a new run (another run.name)."]
            self._verified.add(path)
            return [str(path), None]
        return [None, None]

    def run_id_of(self, path: Path) -> Optional[str]:
        return (read_manifest(path) or {}).get("run_id")

    def load(self, path: Path, model: torch.nn.Module, optimizer) -> TrainerPosition:
        state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        dcp.load(state, checkpoint_id=str(path))  # fills the tensors above in place
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        rng = path / f"rng_rank{self.rank}.pt"
        if rng.is_file():
            torch.set_rng_state(torch.load(rng))
        return TrainerPosition(**json.loads((path / TRAINER_STATE).read_text()))
