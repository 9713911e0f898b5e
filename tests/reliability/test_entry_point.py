"""`python -m dlrmtrain.train` and torchrun: numbers checked at load, a config error
printed once with exit 2 from every rank, no fixed port for a world of one."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys

import pytest

from dlrmtrain.config import ConfigError, load_config
from tests.common import tiny_overrides
from tests.reliability.jobs import REPO, finish, kill_job, output_of, start_job


@pytest.mark.parametrize("override, message", [
    ("optim.lr=.nan", "optim.lr: must be a finite number"),
    ("run.epochs=.inf", "run.epochs: must be a finite number"),
    ("optim.end_lr=-0.1", "optim.end_lr: must not be negative"),
    ("run.seed=-3", "run.seed: must not be negative"),
    ("data.synthetic.num_train_samples=-5", "data.synthetic.num_train_samples: must not be negative"),
    ("data.table_sizes=[3,-1]", r"data.table_sizes\[1\]: must not be negative"),
])
def test_nan_inf_and_negative_numbers_are_rejected_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_config_error_under_torchrun_is_printed_once_and_every_rank_exits_2(tmp_path):
    job = start_job(tmp_path, "run.global_batch_size=255")  # does not divide over 2 ranks
    try:
        rc, _ = finish(job, 120)
    finally:
        kill_job(job)
    out = output_of(tmp_path)
    assert rc != 0
    assert out.count("config error: run.global_batch_size") == 1, out
    assert out.count("exitcode  : 2") == 2 and "exitcode  : 1" not in out, out


def test_a_world_of_one_needs_no_fixed_port(tmp_path):
    """Without torchrun every run used port 29500, so a second one failed to start."""
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 29500))
        held.listen()
    except OSError as e:  # already taken by someone else: the condition we want
        assert e.errno == errno.EADDRINUSE
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dlrmtrain.train",
             *tiny_overrides(str(tmp_path), "run.max_steps=1", "eval.enabled=false")],
            capture_output=True, text=True, timeout=180, cwd=REPO,
            env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    finally:
        held.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "steps            1" in proc.stdout + proc.stderr
