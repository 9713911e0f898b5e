"""`dlrmtrain preprocess-yambda`, as a user runs it: a real process on hand-built parquet files."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.data.yambda.test_parquet_samples import write_dataset

REPO = Path(__file__).resolve().parents[3]


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120)


def inputs(tmp_path: Path, **replace: str) -> list[str]:
    files = {"--events": "multi_event.parquet", "--artists": "artist_item_mapping.parquet",
             "--albums": "album_item_mapping.parquet", **replace}
    return [token for flag, name in files.items() for token in (flag, str(tmp_path / name))]


def test_the_subcommand_prepares_the_same_store_as_the_library(tmp_path):
    write_dataset(tmp_path)
    from dlrmtrain.data.yambda.preprocess import preprocess_yambda
    from dlrmtrain.data.yambda.store import EventStore
    library = preprocess_yambda(tmp_path / "multi_event.parquet", tmp_path / "artist_item_mapping.parquet",
                                tmp_path / "album_item_mapping.parquet", tmp_path / "lib", train_days=2)

    proc = run("-m", "dlrmtrain", "preprocess-yambda", *inputs(tmp_path), "--out", str(tmp_path / "cli"),
               "--train-days", "2")

    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    assert printed == json.loads((tmp_path / "cli" / "store.json").read_text())
    assert {k: v for k, v in printed.items() if k != "source"} == \
        {k: v for k, v in library.items() if k != "source"}
    ours, theirs = EventStore(tmp_path / "cli"), EventStore(tmp_path / "lib")
    for name in theirs.events:
        assert np.array_equal(ours.events[name], theirs.events[name]), name


def test_the_older_form_still_runs_and_says_where_the_command_went(tmp_path, monkeypatch, capsys):
    write_dataset(tmp_path)
    monkeypatch.setattr(sys, "argv", ["preprocess.py", *inputs(tmp_path), "--out", str(tmp_path / "old"),
                                      "--train-days", "2"])
    monkeypatch.delitem(sys.modules, "dlrmtrain.data.yambda.preprocess", raising=False)  # run it afresh
    with pytest.raises(SystemExit) as exited:   # in-process: the subcommand's test above pays
        runpy.run_module("dlrmtrain.data.yambda.preprocess", run_name="__main__")   # the start-up
    assert exited.value.code == 0
    assert "dlrmtrain preprocess-yambda" in capsys.readouterr().err
    assert json.loads((tmp_path / "old" / "store.json").read_text())["num_events"] == 13


@pytest.mark.parametrize("flag", ["--events", "--albums"])
def test_a_missing_input_is_one_line_naming_it_and_exit_2_before_any_work(tmp_path, flag, capsys):
    from dlrmtrain.cli import main
    write_dataset(tmp_path)
    rc = main(["preprocess-yambda", *inputs(tmp_path, **{flag: "typo.parquet"}), "--out", str(tmp_path / "out")])
    assert rc == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'typo.parquet'}: no such parquet file"
    assert not (tmp_path / "out").exists()
