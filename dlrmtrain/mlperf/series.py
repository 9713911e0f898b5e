"""One `dlrmtrain mlperf --out` folder holds one series, and a re-run continues it.

At the first start the runner writes the series' plan to `<out>/plan.json`: the
config as loaded (with its overrides), the contenders, the seeds, the ranks and
link, the benchmark, ruleset and rules (the derived rules' text). A later start on
the same `--out` compares its own plan with it, entry by entry: a different plan
is refused before anything is written or launched (`SeriesRefused`, naming what
differs); the same plan continues the series. `--timeout-min` is not part of the
plan (a re-run may give a run more time). `<out>/series.lock` keeps a second
runner out while one is at work.

Each run of a continued series is in one of three states (`RunState`):
  - finished: its result file is there (written atomically, only after the run
    exited 0): skipped, every file of it left as it is;
  - interrupted: its run folder or console file is there but no result. With a
    verified checkpoint it resumes from it (its console file is appended to);
    without one its folder and console file are moved aside, never deleted, to
    `<run>.interrupted-<n>` and `<run>.interrupted-<n>.out`, and it starts afresh;
  - not started.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlrmtrain.run.errors import SetupError
from dlrmtrain.run.lock import LOCK_FILE as RUN_LOCK_FILE, RunLock, describe_holder

PLAN_FILE = "plan.json"
LOCK_FILE = "series.lock"
MAX_LISTED = 6
"""Differences named in a refusal (the rest are counted)."""


class SeriesRefused(ValueError):
    """`--out` holds something this plan cannot continue; nothing was written (exit 2)."""


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """`a.b.c → leaf` entries of a JSON-like tree (lists are leaves)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(flat(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


_ABSENT = object()


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: saved → current` for every entry of two plans that differs."""
    a, b = flat(saved), flat(current)
    return [_difference(k, a.get(k, _ABSENT), b.get(k, _ABSENT))
            for k in sorted(set(a) | set(b)) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]


def _difference(key: str, saved: Any, current: Any) -> str:
    if isinstance(saved, str) and isinstance(current, str) and "\n" in saved + current:
        old, new = saved.splitlines(), current.splitlines()  # the derived rules' text
        line = next((i for i, (x, y) in enumerate(zip(old, new)) if x != y), min(len(old), len(new)))
        return f"{key}: line {line + 1} {_line(old, line)} → {_line(new, line)}"
    return f"{key}: {_show(saved)} → {_show(current)}"


def _line(lines: list[str], i: int) -> str:
    return json.dumps(lines[i].strip()) if i < len(lines) else "(end)"


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else json.dumps(value)


def claim(out: Path, plan: dict[str, Any]) -> RunLock:
    """Start or continue the series in `out` with `plan` (a JSON-able dict); return the
    held lock. Raises SeriesRefused, having written nothing, when `out` holds another
    plan, a plan it cannot read, or files that are no series."""
    plan = json.loads(json.dumps(plan))  # as it reads back from the file
    check_plan(out, plan)  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out, LOCK_FILE, user="another dlrmtrain mlperf",
                   advice="choose another --out")
    try:
        lock.acquire()
        check_plan(out, plan)  # again, under the lock: a runner that held it may have written one
    except (SetupError, SeriesRefused) as e:
        lock.release()
        raise SeriesRefused(str(e)) from None
    if not (out / PLAN_FILE).is_file():
        write_atomically(out / PLAN_FILE, json.dumps(plan, indent=2) + "\n")
    return lock


def check_plan(out: Path, plan: dict[str, Any]) -> None:
    """Refuse (SeriesRefused) an `out` this plan cannot start or continue."""
    path = out / PLAN_FILE
    if out.exists() and not out.is_dir():
        raise SeriesRefused(f"--out {out} is a file, not a folder")
    if not out.is_dir() or not any(p.name != LOCK_FILE for p in out.iterdir()):
        return  # a new series
    if not path.is_file():
        raise SeriesRefused(f"--out {out} holds files but no {PLAN_FILE}: not a series "
                            f"this runner started (or one from before {PLAN_FILE}); "
                            f"choose another --out")
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise SeriesRefused(f"{path}: unreadable ({e}); choose another --out") from None
    diff = differences(saved, plan)
    if diff:
        more = f"; and {len(diff) - MAX_LISTED} more" if len(diff) > MAX_LISTED else ""
        raise SeriesRefused(
            f"--out {out} holds a series with another plan ({path}): "
            f"{'; '.join(diff[:MAX_LISTED])}{more}. Re-run it as it was started to "
            f"continue it, or choose another --out")


def check_not_in_use(run_dirs: list[Path]) -> None:
    """Refuse when a run's lock is held: a rank of an earlier start may still be stopping.
    Only looks (flock, nothing written)."""
    for run_dir in run_dirs:
        path = run_dir / RUN_LOCK_FILE
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SeriesRefused(f"{run_dir} is still in use ({describe_holder(path)}): a run of "
                                f"an earlier start of this series is stopping; wait for it to "
                                f"end, then re-run") from None
        finally:
            os.close(fd)


def write_atomically(path: Path, text: str) -> None:
    """`path` holds either its old content or all of `text`, never a part."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def copy_atomically(source: Path, dest: Path) -> None:
    write_atomically(dest, source.read_text())


@dataclass(frozen=True)
class RunState:
    """Where one run of the series stands, and how it (re)starts."""

    finished: bool
    resume_from: Path | None = None
    """A verified checkpoint of the interrupted run: it resumes from there."""
    set_aside: Path | None = None
    """Where the interrupted run's folder (or console file) was moved: it starts afresh."""


def prepare_run(result: Path, run_dir: Path, console: Path) -> RunState:
    """The state of the run whose result file is `result`, folder `run_dir` and console
    file `console`; an interrupted run without a verified checkpoint is moved aside."""
    if result.is_file():
        return RunState(finished=True)
    if not run_dir.exists() and not console.exists():
        return RunState(finished=False)
    checkpoint = latest_verified(run_dir / "checkpoints")
    if checkpoint is not None:
        return RunState(finished=False, resume_from=checkpoint)
    return RunState(finished=False, set_aside=set_aside(run_dir, console))


def latest_verified(root: Path) -> Path | None:
    """The newest complete checkpoint (step_<N>, its manifest's checksums hold) in `root`."""
    # imported here: run/checkpoint.py imports torch (seconds), which the runner, a parent
    # of launchers, needs only to resume an interrupted run
    from dlrmtrain.run.checkpoint import verify_checkpoint

    if not root.is_dir():
        return None
    steps = sorted(((int(p.name[5:]), p) for p in root.iterdir()
                    if p.name.startswith("step_") and p.name[5:].isdigit()), reverse=True)
    return next((p for _, p in steps if verify_checkpoint(p) is None), None)


def set_aside(run_dir: Path, console: Path) -> Path:
    """Move the run folder and its console file to the first free `<run>.interrupted-<n>`
    (and `.out`); return the new folder's path (or the console's, without a folder)."""
    n = 1
    while (aside := run_dir.with_name(f"{run_dir.name}.interrupted-{n}")).exists() or \
            aside.with_name(aside.name + ".out").exists():
        n += 1
    moved = aside.with_name(aside.name + ".out")
    if console.exists():
        os.rename(console, moved)
    if run_dir.exists():
        os.rename(run_dir, aside)
        moved = aside
    return moved
