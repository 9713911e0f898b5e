"""`python -m dlrmtrain.train` and torchrun: numbers checked at load, a config error
printed once with exit 2 from every rank, no fixed port for a world of one."""

from __future__ import annotations

import errno
import re
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
    # The root cause is rank 0's exit 2. Every rank exits 2 by itself, but torchrun sends
    # SIGTERM to ranks still running once one has failed: under load the other rank can be
    # stopped that way before it reaches its own exit (-15). No rank dies of a traceback (1).
    root = out.split("Root Cause", 1)[-1]
    assert "exitcode  : 2" in root, out
    codes = re.findall(r"exitcode  : (-?\d+)", out)
    assert len(codes) == 2 and set(codes) <= {"2", "-15"}, out


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


@pytest.mark.parametrize("name", ["..", "", ".", "a/b", "/tmp/abs"])
def test_a_run_name_that_is_not_one_folder_is_refused(name):
    """Issue 29: `run.name=""` wrote straight into run.output_dir, `..` left it."""
    from dlrmtrain.config.checks import check_run

    with pytest.raises(ConfigError, match=r"run.name: .* must name one folder inside run.output_dir"):
        check_run(load_config(None, [f"run.name={name!r}"]), 1)


def test_run_name_off_says_to_quote_it():
    with pytest.raises(ConfigError, match=r"override 'run.name=off': run.name: expected a string, "
                                          r"got False \(YAML reads on, off"):
        load_config(None, ["run.name=off"])
    assert load_config(None, ["run.name='off'"]).run.name == "off"


def test_a_non_utf8_config_file_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  name: café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"{path}: not UTF-8 text \(byte 0xe9 at offset 16\)"):
        load_config(path)


def test_an_override_typo_is_blamed_on_the_override_not_the_file(tmp_path):
    """Issue 29: `optm.lr=0.1` was reported as the config file's unknown key."""
    config = REPO / "configs" / "quickstart.yaml"
    with pytest.raises(ConfigError, match=r"^override 'optm.lr=0.1': unknown key optm "):
        load_config(config, ["optm.lr=0.1"])
    with pytest.raises(ConfigError, match=r"^override 'run.epochs=abc': run.epochs: expected a"):
        load_config(config, ["run.epochs=abc"])
    typo = tmp_path / "typo.yaml"  # the same kind of typo in a file: the file is blamed
    typo.write_text(f"base: {config}\nrun:\n  nme: x\n")
    with pytest.raises(ConfigError, match=rf"^{typo}: unknown key run.nme "):
        load_config(typo, ["run.epochs=2"])
