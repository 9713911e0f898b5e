"""The preprocess commands are numpy work: they start without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_preprocess_commands_start_without_torch():
    """Importing `dlrmtrain preprocess`'s and `preprocess-yambda`'s modules loads no torch or
    torchrec (~6 s of CPU per process on this machine while the data package imported them)."""
    code = ("import sys, dlrmtrain.data.preprocess.cli, dlrmtrain.data.yambda.preprocess; "
            "print(sorted(m for m in ('torch', 'torchrec') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[3]).stdout.strip()
    assert out == "[]"
