"""scripts/gpu_check.py runs on CPU (so the prepared device check cannot rot) with torch alone,
at both sizes: `--quick` and the full size a lent GPU runs (every case at every size; a case
whose inputs fit one size only failed there, unseen by a quick-only run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# torchrec and fbgemm made unimportable (`sys.modules[name] = None`), as on a machine with torch alone
BLOCKED_RUN = (
    "import runpy, sys\n"
    "for name in ('torchrec', 'fbgemm_gpu'):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['gpu_check.py', '--device', 'cpu'] + sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_path('scripts/gpu_check.py', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    sys.exit(e.code)\n"
)


@pytest.mark.parametrize("size", ["--quick", "full"])
def test_gpu_check_runs_on_cpu_without_torchrec_or_fbgemm(size):
    args = [size] if size.startswith("--") else []
    out = subprocess.run([sys.executable, "-c", BLOCKED_RUN, *args], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("| section") for line in lines), out.stdout  # the table's header
    sections = {}
    for line in lines:
        if line.startswith("| ") and not line.startswith("| section"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            sections.setdefault(cells[0], []).append(cells)
    assert set(sections) == {"bitwise", "bf16", "collectives", "fixed cost", "throughput"}
    assert len(sections["bitwise"]) >= 10 and all(c[2] == "ok" for c in sections["bitwise"]), sections["bitwise"]
    assert [c[2] for c in sections["collectives"]] == ["ok", "ok", "ok", "refused"], sections["collectives"]
    fixed = {c[1]: c for c in sections["fixed cost"]}
    assert fixed["ops independent of world size"][2] == "yes", fixed
    assert "checks passed" in lines[-1] and "FAILED" not in lines[-1]
