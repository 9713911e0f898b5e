"""A run owns its directory and its checkpoints (issue 13, bugs 1, 2, 3 and 5).

Each test trains a world of one in a spawned process (real process group,
real files); a run that cannot start returns the error instead of raising, so
the test can check its message.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.common import tiny_overrides
from tests.multiproc import run_ranks

RUN = ["run.name=own", "eval.enabled=false", "checkpoint.every_steps=2"]


def _runs(rank, world_size, out_dir, runs):
    """Train once per override list, in order; each result is the summary or the
    SetupError's message."""
    from dlrmtrain.config import load_config
    from dlrmtrain.config.validate import validate_config
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.errors import SetupError
    from dlrmtrain.trainer import Trainer

    results = []
    for overrides in runs:
        cfg = load_config(None, tiny_overrides(out_dir, *overrides))
        validate_config(cfg, world_size)
        try:
            trainer = Trainer(cfg, init_distributed("cpu"))
        except SetupError as e:
            results.append(f"SetupError: {e}")
            continue
        results.append(trainer.train().as_dict())
        trainer.close()
        del trainer
    return results


def _train(tmp_path, *runs, timeout=240):
    return run_ranks(_runs, 1, str(tmp_path), [RUN + list(r) for r in runs], timeout=timeout)[0]


def _metrics(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "own" / "metrics.jsonl").read_text().splitlines()]


def test_data_without_one_full_batch_stops_at_once(tmp_path):
    """Bug 1: 200 file rows under a global batch of 256 looped over empty epochs forever."""
    from dlrmtrain.config import load_config
    from dlrmtrain.data.synthetic_files import write_synthetic_dataset

    data = load_config(None, tiny_overrides(str(tmp_path))).data
    write_synthetic_dataset(data, tmp_path / "ds", rows_per_part=200, num_parts=2, progress=False)
    files = [f"data.source=criteo", f"data.path={tmp_path / 'ds'}", "data.format=dlrmtrain",
             "data.split=names", "data.train_parts=[day_0]", "data.eval_parts=[day_1]",
             "mlperf.enabled=true"]
    [result] = _train(tmp_path, files, timeout=120)
    assert result.startswith("SetupError")
    assert "200 training rows" in result and "global batch of 256" in result
    assert "world size 1" in result


def test_resumed_run_appends_its_records_and_marks_the_restart(tmp_path):
    """Bug 3: a resumed run opened metrics.jsonl for writing and erased steps 1..4."""
    _train(tmp_path, ["run.max_steps=4"], ["run.max_steps=6", "checkpoint.resume=true"])
    records = _metrics(tmp_path)
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]
    [marker] = [r for r in records if r["kind"] == "resumed"]
    assert marker["step"] == 4 and marker["checkpoint"].endswith("step_4")
    kinds_steps = [(r["kind"], r["step"]) for r in records]
    assert kinds_steps.index(("resumed", 4)) == kinds_steps.index(("train", 5)) - 1


def test_reusing_a_run_name_refuses_unless_told_to_overwrite(tmp_path):
    """Bug 3: a new run under the same name silently replaced the earlier run's files."""
    first, refused, replaced = _train(tmp_path, ["run.max_steps=2"], ["run.max_steps=2"],
                                      ["run.max_steps=1", "run.overwrite=true",
                                       "checkpoint.every_steps=0"])
    assert first["steps"] == 2
    assert refused.startswith("SetupError") and "run.overwrite=true" in refused
    assert "metrics.jsonl" in refused and "checkpoint" in refused
    assert replaced["steps"] == 1
    run_dir = tmp_path / "own"
    # Overwriting leaves only the new run's files: no checkpoint of the earlier run.
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())
    assert [r["step"] for r in _metrics(tmp_path) if r["kind"] == "train"] == [1]


def test_overwrite_removes_every_record_of_the_earlier_run(tmp_path):
    """A stale comm_stats.json (the earlier run used a codec, the new one does not)
    must not sit next to the new run's records."""
    stale = tmp_path / "own" / "comm_stats.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    [refused, done] = _train(tmp_path, ["run.max_steps=1"],
                             ["run.max_steps=1", "run.overwrite=true"])
    assert "comm_stats.json" in refused
    assert done["steps"] == 1 and not stale.exists()


def test_retention_keeps_this_runs_newest_valid_checkpoints(tmp_path):
    """Bug 2: a higher-numbered corrupt checkpoint made each new one vanish on save."""
    import shutil

    _train(tmp_path, ["run.max_steps=4", "checkpoint.keep=1"])
    ckpts = tmp_path / "own" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_4"]
    shutil.copytree(ckpts / "step_4", ckpts / "step_50")
    state = ckpts / "step_50" / "trainer_state.json"
    state.write_text(state.read_text().replace("4", "5"))  # same size, other bytes
    [summary] = _train(tmp_path, ["run.max_steps=8", "checkpoint.keep=1",
                                  "checkpoint.resume=true"])
    assert summary["steps"] == 8
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_50", "step_8"]
    assert json.loads((ckpts / "step_8" / "manifest.json").read_text())["run_id"] == \
        json.loads((tmp_path / "own" / "run.json").read_text())["run_id"]


def test_resume_refuses_a_checkpoint_trained_with_another_config(tmp_path):
    """Bugs 2 and 5: resuming with another learning rate or batch size continued
    silently (at "batch N" of the new size: skipped or repeated data)."""
    first, lr, batch = _train(tmp_path, ["run.max_steps=2"],
                              ["run.max_steps=4", "checkpoint.resume=true", "optim.lr=0.1"],
                              ["run.max_steps=4", "checkpoint.resume=true",
                               "run.global_batch_size=128"])
    assert first["steps"] == 2
    assert lr.startswith("SetupError") and "optim.lr: 0.05 → 0.1" in lr
    assert batch.startswith("SetupError") and "run.global_batch_size: 256 → 128" in batch
    # Nothing of the refused runs was written: the records end at step 2.
    assert [r["step"] for r in _metrics(tmp_path) if r["kind"] == "train"] == [1, 2]


def test_unwritable_run_directory_is_found_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    [result] = run_ranks(_runs, 1, str(blocker), [RUN + ["run.max_steps=1"]], timeout=120)[0]
    assert result.startswith("SetupError") and "run.output_dir" in result
    assert str(blocker) in result
