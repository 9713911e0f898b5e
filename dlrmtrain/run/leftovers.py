"""Leftovers of interrupted writes: a temporary folder names the process writing it
(`.<name>.tmp-<pid>` for data parts, an owner file in a checkpoint's `.partial`),
and the next start removes those whose writer is gone."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Callable

_TMP_DIR = re.compile(r"^\..+\.tmp-(\d+)$")
PARTIAL_DIR = re.compile(r"^step_(\d+)\.partial$")
OWNER = "owner.json"  # in a checkpoint's .partial folder only: the process writing it


def owner_record() -> str:
    """The content of an owner file: this host and process."""
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid()})


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def remove_dead_tmp_dirs(folder: Path) -> list[Path]:
    """Delete `.<name>.tmp-<pid>` folders in `folder` whose process is gone."""
    removed = []
    if not folder.is_dir():
        return removed
    for path in sorted(folder.iterdir()):
        m = _TMP_DIR.match(path.name)
        if m and path.is_dir() and not process_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def remove_dead_partials(root: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Delete `step_<N>.partial/` folders whose writer is no longer alive on this host
    (or that name no writer). A partial written from another host is left alone."""
    removed = []
    if not root.is_dir():
        return removed
    for path in sorted(root.iterdir()):
        if not PARTIAL_DIR.match(path.name):
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
