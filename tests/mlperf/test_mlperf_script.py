"""scripts/mlperf_run.sh takes its Criteo data only from where the user says."""

from __future__ import annotations

import os
import subprocess

from tests.data.raw_rows import REPO_ROOT


def test_a_missing_data_file_is_named_and_nothing_runs(tmp_path):
    missing = tmp_path / "criteo_kaggle_sample.tsv.gz"
    proc = subprocess.run(["bash", "scripts/mlperf_run.sh", "--data", str(missing)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DLRMTRAIN_SHARED_DATA": ""})
    assert proc.returncode == 2
    assert f"--data {missing}: no such file" in proc.stderr

