"""scripts/gpu_check_attention.py runs on CPU (Triton's interpreter, tiny sizes) with torch and
triton alone, so the device check prepared for a lent GPU cannot rot; its sample lengths are
the reference's fill."""

from __future__ import annotations

import subprocess
import sys

from tests.scripts import REPO, load_script

# torchrec and fbgemm made unimportable (`sys.modules[name] = None`), as on a lent GPU machine
BLOCKED_RUN = (
    "import runpy, sys\n"
    "for name in ('torchrec', 'fbgemm_gpu'):\n"
    "    sys.modules[name] = None\n"
    "sys.argv = ['gpu_check_attention.py', '--device', 'cpu']\n"
    "try:\n"
    "    runpy.run_path('scripts/gpu_check_attention.py', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    sys.exit(e.code)\n"
)


def test_cpu_mode_checks_and_times_both_kernels_without_torchrec_or_fbgemm():
    out = subprocess.run([sys.executable, "-c", BLOCKED_RUN], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "Triton's interpreter" in lines[0], lines[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines
            if line.startswith("| ") and not line.startswith("| section")]
    numeric = [r for r in rows if r[0] == "numeric"]
    assert [r[1].split()[0] for r in numeric] == ["bfloat16", "float32"] and all(r[2] == "ok" for r in numeric), numeric
    timed = [r[1] for r in rows if r[0] == "timing" and r[2].endswith(" ms")]
    assert [t.split(",")[0] for t in timed] == ["padded", "triton", "triton"], timed
    assert "checks passed" in lines[-1] and "FAILED" not in lines[-1], lines[-1]


def test_lengths_are_the_reference_fill():
    """8 contextual + two full pools of 1,362 + the like pool (mean 105, at most 1,362) + 1
    candidate: 2,733..4,095 rows of N = 4,096, about 2,838 on average."""
    script = load_script("gpu_check_attention")
    lengths = script.draw_lengths(script.FULL, 4096, "cpu")
    assert int(lengths.min()) >= 8 + 2 * 1362 + 1 and int(lengths.max()) <= 4095
    assert abs(float(lengths.float().mean()) - (8 + 2 * 1362 + 105 + 1)) < 6
    assert len(set(lengths.tolist())) > 100  # lengths vary
    assert script.draw_lengths(script.FULL, 16, "cpu").tolist() == script.draw_lengths(script.FULL, 16, "cpu").tolist()
