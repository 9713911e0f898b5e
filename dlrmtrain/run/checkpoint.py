"""Checkpoints: sharded model, fused and dense optimizer state, schedule, data
position and RNG, saved atomically and verified before they are trusted.

Layout of one checkpoint, `<dir>/step_<N>/`:
  *.distcp, .metadata   torch.distributed.checkpoint (DCP) files: every rank
                        writes its own shards of the model and optimizer
  rng_rank<r>.pt        each rank's torch RNG states: the CPU's, and every visible GPU's
  trainer_state.json    step, epoch, position in the epoch, LR-schedule state
  manifest.json         size and sha256 of every file above — written last
A checkpoint is written into `step_<N>.partial/` and renamed only after every
rank has finished and rank 0 has written the manifest; so a save interrupted
at any point leaves no `step_<N>/`. Loading re-checks the manifest: a file
that is missing, truncated or altered makes the checkpoint invalid, and the
previous one is used instead. (Assumes a filesystem all ranks share.)

A checkpoint belongs to one run: its manifest holds the run id and the
math-changing config (identity.py). Retention deletes only this run's
older valid checkpoints; resume takes only this run's and refuses one whose
math-changing config differs, naming the keys. A `step_<N>.partial/` holds an
owner file (host, pid) so the next start can remove those left by dead processes
(leftovers.py).

A save that fails on any rank (a full disk, an I/O error, a permission) fails on
every rank alike: the ranks agree on the outcome of each phase, rank 0 removes the
`.partial`, and `CheckpointWriteError` names the directory, the bytes the save
needs and the bytes free. Earlier checkpoints are untouched (retention runs only
after a save has committed). `estimate_checkpoint_bytes` gives the expected size
at start, so a directory too small for `keep` + 1 checkpoints is known early.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from dlrmtrain.known_warnings import checkpoint_calls_quiet
from dlrmtrain.run.console import human_bytes
from dlrmtrain.run.errors import CheckpointWriteError, SetupError
from dlrmtrain.run.identity import differing_keys, fingerprint
from dlrmtrain.run.leftovers import OWNER, owner_record

_STEP_DIR = re.compile(r"^step_(\d+)$")
MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"


class ResumeRefused(SetupError):
    """The checkpoint to resume from was trained with a different math-changing config."""


@dataclass
class TrainerPosition:
    """Where training stands; enough to continue the same trajectory."""

    step: int
    epoch: int
    step_in_epoch: int
    schedule: dict[str, Any]


def rng_state() -> dict[str, Any]:
    """This process's torch RNG states: the CPU generator's and, where CUDA is present,
    every visible GPU's (DLRMv4's dropout draws on the GPU's generator; a resume that
    restored the CPU's alone would draw other masks from there on)."""
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng_state(state: Any) -> None:
    """Set the states `rng_state` returned. A checkpoint from before the GPUs' states were
    kept holds the CPU's alone (a tensor): it loads, the GPUs' generators staying as seeded.
    GPUs this process cannot see keep no state (fewer visible than when saved)."""
    if isinstance(state, torch.Tensor):
        state = {"cpu": state, "cuda": []}
    torch.set_rng_state(state["cpu"])
    if state["cuda"] and torch.cuda.is_available():
        for device, gpu_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(gpu_state, device)


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


# DCP's cost per tensor (pickled metadata, headers), measured on the tests' tiny model
_BYTES_PER_ENTRY = 1536


def _local_checkpoint_bytes(state: Any, rank: int) -> int:
    """Bytes this rank writes of `state`: its shards of sharded tensors, and (rank 0
    only) the replicated ones, which DCP writes once; each entry also costs a little."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if isinstance(state, dict):
        return sum(_local_checkpoint_bytes(v, rank) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_local_checkpoint_bytes(v, rank) for v in state)
    if isinstance(state, ShardedTensor):
        return sum(s.tensor.numel() * s.tensor.element_size() + _BYTES_PER_ENTRY
                   for s in state.local_shards())
    if hasattr(state, "to_local") and isinstance(state, torch.Tensor):  # DTensor
        return state.to_local().numel() * state.element_size() + _BYTES_PER_ENTRY
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size() + _BYTES_PER_ENTRY if rank == 0 else 0
    return 0


def estimate_checkpoint_bytes(model: torch.nn.Module, optimizer, rank: int,
                              device: torch.device) -> int:
    """About how many bytes one checkpoint takes (all ranks together; a collective on
    `device`, the process group's: NCCL reduces only CUDA tensors)."""
    local = _local_checkpoint_bytes({"model": model.state_dict(),
                                     "optim": optimizer.state_dict()}, rank)
    local += 8 * 1024  # this rank's RNG state file
    total = torch.tensor([local], dtype=torch.int64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    return int(total.item())


def free_bytes(directory: Path) -> int:
    return shutil.disk_usage(directory).free


def space_warning(root: Path, keep: int, size: int) -> Optional[str]:
    """The warning for a checkpoint directory that cannot hold `keep` + 1 checkpoints of
    `size` bytes (retention deletes the oldest only after the next one is complete)."""
    needed = (keep + 1) * size
    free = free_bytes(root)
    if free >= needed:
        return None
    return (f"warning: {root} has {human_bytes(free)} free; checkpoint.keep={keep} needs "
            f"room for {keep + 1} checkpoints of about {human_bytes(size)} ({human_bytes(needed)})")


def _cause(exc: BaseException) -> str:
    """The one-line reason of a failed write, from an OSError wherever DCP wrapped it."""
    seen: list[BaseException] = [exc]
    while seen:
        e = seen.pop(0)
        if isinstance(e, OSError) and e.strerror:
            return e.strerror
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):  # DCP's CheckpointException: rank -> (exception, trace)
            seen.extend(f[0] for f in failures.values() if isinstance(f, tuple))
        for linked in (e.__cause__, e.__context__):
            if linked is not None:
                seen.append(linked)
    first = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {first[-1] if first else ''}"[:200]


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
        self.expected_bytes: Optional[int] = None  # estimate_checkpoint_bytes, then the last save's size
        self.last_step: Optional[int] = None       # step of the newest checkpoint written or loaded
        self._verified: set[Path] = set()  # checked (or written) by this process: valid
        self.rejected: list[str] = []  # why latest_valid passed over each newer one (rank 0)

    def expect_size(self, model: torch.nn.Module, optimizer, device: torch.device) -> None:
        """Estimate a checkpoint's size (a collective); warn when the directory cannot hold
        `keep` + 1 of them (retention deletes the oldest only after the next one is complete)."""
        self.expected_bytes = estimate_checkpoint_bytes(model, optimizer, self.rank, device)
        warning = space_warning(self.root, self.keep, self.expected_bytes)
        if warning:
            self.log(warning)

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def _agree(self, problem: Optional[str]) -> Optional[str]:
        """Every rank's outcome of a phase of the save: the first problem, or None."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return problem
        problems: list[Optional[str]] = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
        return next((f"rank {r}: {p}" for r, p in enumerate(problems) if p is not None), None)

    def save(self, model: torch.nn.Module, optimizer, position: TrainerPosition) -> Path:
        """Write step_<N>/ atomically; raise CheckpointWriteError on every rank if any
        rank could not write its part (the .partial is removed, older ones stay valid).
        Each phase ends with the ranks agreeing on its outcome (also the barrier that
        orders the phases)."""
        final = self.root / f"step_{position.step}"
        partial = self.root / f"step_{position.step}.partial"
        problem = self._agree(self._attempt(lambda: self._prepare(partial)) if self.rank == 0
                              else None)
        if problem is None:
            problem = self._agree(self._attempt(lambda: self._write(partial, model, optimizer)))
        if problem is None:
            problem = self._agree(self._attempt(lambda: self._commit(partial, final, position))
                                  if self.rank == 0 else None)
        if problem is not None:
            self._fail(partial, position.step, problem)
        self.last_step = position.step
        return final

    @staticmethod
    def _attempt(phase: Callable[[], None]) -> Optional[str]:
        """None when `phase` ran, else why it failed (one line)."""
        try:
            phase()
        except (Exception, CheckpointException) as e:  # the latter is a BaseException
            return _cause(e)
        return None

    def _prepare(self, partial: Path) -> None:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        (partial / OWNER).write_text(owner_record())

    def _write(self, partial: Path, model: torch.nn.Module, optimizer) -> None:
        """Every rank: its shards (DCP raises on every rank if any rank fails) and RNG state."""
        with checkpoint_calls_quiet():
            dcp.save({"model": model.state_dict(), "optim": optimizer.state_dict()},
                     checkpoint_id=str(partial))
        torch.save(rng_state(), partial / f"rng_rank{self.rank}.pt")

    def _disk_full(self) -> bool:
        """Whether the checkpoint directory's file system has (next to) no room left."""
        try:
            free = free_bytes(self.root)
        except OSError:
            return False
        return free < min(self.expected_bytes or 0, 1 << 20) or free < 64 * 1024

    def _commit(self, partial: Path, final: Path, position: TrainerPosition) -> None:
        """Rank 0: the trainer state and the manifest, then the rename that commits."""
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
        self.expected_bytes = sum(f["bytes"] for f in files.values())
        self._verified.add(final)
        self._apply_retention()

    def _fail(self, partial: Path, step: int, problem: str) -> None:
        if "No space left" not in problem and self._disk_full():
            # torch.save says only "unexpected pos ..." when the disk fills under it
            problem = problem.split(": ", 1)[0] + ": No space left on device" \
                if problem.startswith("rank ") else "No space left on device"
        self._barrier()  # every rank has looked at the full disk
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        self._barrier()  # the partial is gone before any rank reports
        free = free_bytes(self.root) if self.root.is_dir() else 0
        needed = (f"needs about {human_bytes(self.expected_bytes)}, "
                  if self.expected_bytes else "")
        kept = [p.name for _, p in _step_dirs(self.root)]
        raise CheckpointWriteError(
            f"checkpoint of step {step} could not be written to {self.root} ({problem}): it "
            f"{needed}{human_bytes(free)} free there; removed {partial.name}; "
            + (f"earlier checkpoints kept: {', '.join(kept)}" if kept else "no earlier checkpoint"))

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
        self.rejected = []
        for _, path in _step_dirs(self.root):
            problem = verify_checkpoint(path)
            if problem is not None:
                self.log(f"checkpoint rejected: {problem}; trying an older one")
                self.rejected.append(problem)
                continue
            manifest = read_manifest(path) or {}
            owner = manifest.get("run_id")
            if not any_run and owner != self.run_id:
                self.log(f"checkpoint skipped: {path} belongs to run {owner}, "
                         f"not this run {self.run_id}")
                self.rejected.append(f"{path}: belongs to run {owner}, not this run {self.run_id}")
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

    def resume(self, path: Path, model: torch.nn.Module, optimizer,
               adopt_run_id: bool) -> TrainerPosition:
        """`load`, and say so; `adopt_run_id` (no run.json, e.g. records lost): the run
        trained on is the checkpoint's."""
        if adopt_run_id:
            self.run_id = self.run_id_of(path)
        pos = self.load(path, model, optimizer)
        self.log(f"resumed from {path} at step {pos.step} (epoch {pos.epoch}, "
                 f"batch {pos.step_in_epoch})")
        return pos

    def load(self, path: Path, model: torch.nn.Module, optimizer) -> TrainerPosition:
        state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        with checkpoint_calls_quiet():
            dcp.load(state, checkpoint_id=str(path))  # fills the tensors above in place
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        self.last_step = int(json.loads((path / TRAINER_STATE).read_text())["step"])
        rng = path / f"rng_rank{self.rank}.pt"
        if rng.is_file():
            restore_rng_state(torch.load(rng))
        return TrainerPosition(**json.loads((path / TRAINER_STATE).read_text()))
