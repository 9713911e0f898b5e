"""scripts/bench_codec_kernels.py times exactly the kernels training calls, with torch alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KERNELS = "dlrmtrain.comm.dedup.kernels"
TRAINING = ["dlrmtrain/comm/dedup/transport.py", "dlrmtrain/comm/dedup/table_wise.py",
            "dlrmtrain/comm/dedup/row_wise.py", "dlrmtrain/comm/dedup/buffers.py",
            *sorted(str(p.relative_to(REPO)) for p in (REPO / "dlrmtrain/comm/dedup/two_level").glob("*.py"))]


def kernels_called(path: Path) -> set[str]:
    """Functions of the kernels module that `path` imports and calls."""
    tree = ast.parse(path.read_text())
    imported = {a.asname or a.name for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module == KERNELS for a in n.names}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return imported & called


def test_bench_times_what_training_calls():
    kernels_tree = ast.parse((REPO / "dlrmtrain/comm/dedup/kernels.py").read_text())
    public = {n.name for n in kernels_tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    training = set().union(*(kernels_called(REPO / p) for p in TRAINING)) & public  # functions, not classes
    timed = kernels_called(REPO / "scripts/bench_codec_kernels.py")
    assert training - {"host_to_device"} <= timed, f"training kernels the bench does not time: {training - timed}"
    assert timed <= training, f"the bench times kernels training never calls: {timed - training}"
    # every public kernel is used by training: no second, untimed copy lives on (but block_unique,
    # one block keyed column by column: the reference the batched kernel is tested and timed against)
    assert public <= training | {"block_unique", "bag_keys", "unique_bags"}, public - training


def test_bench_runs_without_torchrec_or_fbgemm():
    code = ("import runpy, sys\n"
            "sys.argv = ['bench', '--batch-size', '64', '--tables', '3', '--dim', '8', '--repeats', '1',"
            " '--devices', 'cpu']\n"
            "try:\n"
            "    runpy.run_path('scripts/bench_codec_kernels.py', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torchrec', 'fbgemm_gpu'))\n"
            "assert not bad, bad\n"
            "print('imports checked')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "segment-sum" in out.stdout and "expand" in out.stdout and "imports checked" in out.stdout
