"""Leftovers of interrupted writes: a temporary folder names the process writing it
(`.<name>.tmp-<pid>` for data parts, an owner file in a checkpoint's `.partial`),
and the next start removes those whose writer is gone."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_TMP_DIR = re.compile(r"^\..+\.tmp-(\d+)$")


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
