"""A run owns its directory and its checkpoints (issue 13, bugs 1, 2, 3 and 5).

The scenarios train a world of one in ONE spawned process (real process group,
real files; one process because starting one costs more than the training),
each in its own folder. A run that cannot start records its SetupError's
message instead of raising, so the tests can check what it says.
"""

from __future__ import annotations

import json
import shutil
import traceback
from pathlib import Path

import pytest

from tests.common import tiny_overrides
from tests.multiproc import run_ranks

RUN = ["run.name=own", "eval.enabled=false", "checkpoint.every_steps=2"]


def copy_as_corrupt_checkpoint(out_dir: str, src: int, dst: int) -> None:
    """A higher-numbered copy of this run's checkpoint with one changed byte."""
    ckpts = Path(out_dir) / "own" / "checkpoints"
    shutil.copytree(ckpts / f"step_{src}", ckpts / f"step_{dst}")
    state = ckpts / f"step_{dst}" / "trainer_state.json"
    state.write_text(state.read_text().replace(str(src), str(src + 1), 1))  # same size


def corrupt_every_checkpoint(out_dir: str) -> None:
    """One flipped byte in a shard of each of the run's checkpoints."""
    for ckpt in sorted((Path(out_dir) / "own" / "checkpoints").glob("step_*")):
        shard = next(p for p in sorted(ckpt.iterdir()) if p.suffix == ".distcp")
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))


TORN = b'{"kind": "train", "time": 17.5, "step": 3, "lo'


def tear_metrics(out_dir: str) -> None:
    """The start of a record without its end, as a run killed mid-write leaves it."""
    with open(Path(out_dir) / "own" / "metrics.jsonl", "ab") as f:
        f.write(TORN)


def write_stale_record(out_dir: str) -> None:
    """A comm_stats.json left by an earlier run (that one used a codec)."""
    (Path(out_dir) / "own" / "comm_stats.json").write_text("{}")


def snapshot_records(out_dir: str) -> None:
    """Every record of the run as it is now, kept beside the run directory."""
    run_dir = Path(out_dir) / "own"
    records = {p.name: p.read_text() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != "run.lock"}
    (Path(out_dir) / "records_before.json").write_text(json.dumps(records))


def compare_records(out_dir: str) -> None:
    """The names of the run's records that differ from `snapshot_records`'."""
    before = json.loads((Path(out_dir) / "records_before.json").read_text())
    run_dir = Path(out_dir) / "own"
    now = {p.name: p.read_text() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != "run.lock"}
    changed = sorted(n for n in set(before) | set(now) if before.get(n) != now.get(n))
    (Path(out_dir) / "records_changed.json").write_text(json.dumps(changed))


def _runs(out_dir, runs):
    """Train once per override list, in order (a tuple (function, *args) is called in
    between); each result is the summary or the SetupError's message."""
    from dlrmtrain.config import load_config
    from dlrmtrain.validation import resolve_config, validate_config
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.run.errors import SetupError
    from dlrmtrain.trainer import Trainer

    results = []
    for overrides in runs:
        if isinstance(overrides, tuple):
            overrides[0](out_dir, *overrides[1:])
            continue
        cfg = resolve_config(load_config(None, tiny_overrides(out_dir, *RUN, *overrides)))
        validate_config(cfg, 1)
        try:
            trainer = Trainer(cfg, init_distributed("cpu"))
        except SetupError as e:  # exit 2, or its own code (RunAlreadyFinished: 0)
            code = getattr(e, "exit_code", 2)
            results.append(f"SetupError{'' if code == 2 else f' (exit {code})'}: {e}")
            continue
        results.append(trainer.train().as_dict())
        trainer.close()
        del trainer
    return results


def _scenarios(rank, world_size, scenarios):
    outcomes = {}
    for name, (out_dir, runs) in scenarios.items():
        try:
            outcomes[name] = _runs(out_dir, runs)
        except Exception:  # one broken scenario must not hide the others' results
            outcomes[name] = traceback.format_exc()
    return outcomes


# Reaches AUC 0.5 at step 8 of 12 (evaluating every 4 steps) and stops there, its checkpoint kept.
AT_TARGET = ["run.max_steps=12", "eval.enabled=true", "eval.evals_per_epoch=4",
             "eval.target_auc=0.5"]

SCENARIOS = {
    "resume_appends": [["run.max_steps=4"], ["run.max_steps=6", "checkpoint.resume=true"]],
    "name_reuse": [["run.max_steps=2"], ["run.max_steps=2"],
                   ["run.max_steps=1", "run.overwrite=true", "checkpoint.every_steps=0"]],
    "stale_record": [(write_stale_record,), ["run.max_steps=1"],
                     ["run.max_steps=1", "run.overwrite=true"]],
    "retention": [["run.max_steps=4", "checkpoint.keep=1"],
                  (copy_as_corrupt_checkpoint, 4, 50),
                  ["run.max_steps=8", "checkpoint.keep=1", "checkpoint.resume=true"]],
    "finished": [["run.max_steps=2", "eval.enabled=true", "checkpoint.at_end=true"],
                 (snapshot_records,),
                 ["run.max_steps=2", "eval.enabled=true", "checkpoint.resume=true"],
                 (compare_records,),
                 ["run.max_steps=3", "checkpoint.resume=true"]],
    "no_usable_checkpoint": [["run.max_steps=4"], (corrupt_every_checkpoint,), (snapshot_records,),
                             ["run.max_steps=6", "checkpoint.resume=true"], (compare_records,)],
    "finished_without_checkpoint": [["run.max_steps=2", "checkpoint.every_steps=0"],
                                    (snapshot_records,),
                                    ["run.max_steps=2", "checkpoint.resume=true"],
                                    ["run.max_steps=3", "checkpoint.resume=true"],
                                    (compare_records,)],
    "at_target": [[*AT_TARGET], (snapshot_records,), [*AT_TARGET, "checkpoint.resume=true"],
                  (compare_records,)],
    "torn_line": [["run.max_steps=2"], (tear_metrics,),
                  ["run.max_steps=3", "checkpoint.resume=true"]],
    "codec_change": [["run.max_steps=2", "comm.codec=none"],
                     ["run.max_steps=4", "checkpoint.resume=true", "comm.codec=dedup"],
                     ["run.max_steps=6", "checkpoint.resume=true", "comm.codec=auto",
                      "comm.table_codecs={t_cat_2: none}"],
                     ["run.max_steps=8", "checkpoint.resume=true", "comm.codec=fp16"]],
    "other_config": [["run.max_steps=2"],
                     ["run.max_steps=4", "checkpoint.resume=true", "optim.lr=0.1"],
                     ["run.max_steps=4", "checkpoint.resume=true", "run.global_batch_size=128"]],
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    root = tmp_path_factory.mktemp("ownership")
    (root / "stale_record" / "own").mkdir(parents=True)
    (root / "blocked").write_text("a file where the output folder should be")
    scenarios = {name: (str(root / name), runs) for name, runs in SCENARIOS.items()}
    scenarios["unwritable"] = (str(root / "blocked"), [["run.max_steps=1"]])
    results = run_ranks(_scenarios, 1, scenarios, timeout=400)[0]
    return root, results


def _outcome(outcomes, name):
    root, results = outcomes
    result = results[name]
    assert isinstance(result, list), result  # else the scenario crashed: its traceback
    return root / name, result


def _metrics(run_root: Path) -> list[dict]:
    return [json.loads(line) for line in (run_root / "own" / "metrics.jsonl").read_text().splitlines()]


def test_resumed_run_appends_its_records_and_marks_the_restart(outcomes):
    """Bug 3: a resumed run opened metrics.jsonl for writing and erased steps 1..4."""
    run_root, _ = _outcome(outcomes, "resume_appends")
    records = _metrics(run_root)
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    [marker] = [r for r in records if r["kind"] == "resumed"]
    assert marker["step"] == 4 and marker["checkpoint"].endswith("step_4")
    kinds_steps = [(r["kind"], r["step"]) for r in records]
    assert kinds_steps.index(("resumed", 4)) == kinds_steps.index(("train", 5)) - 1


def test_reusing_a_run_name_refuses_unless_told_to_overwrite(outcomes):
    """Bug 3: a new run under the same name silently replaced the earlier run's files."""
    run_root, (first, refused, replaced) = _outcome(outcomes, "name_reuse")
    assert first["steps"] == 2
    assert refused.startswith("SetupError") and "run.overwrite=true" in refused
    assert "metrics.jsonl" in refused and "checkpoint" in refused
    assert replaced["steps"] == 1
    # Overwriting leaves only the new run's files: no checkpoint of the earlier run.
    assert not any((run_root / "own" / "checkpoints").iterdir())
    assert [r["step"] for r in _metrics(run_root) if r["kind"] == "train"] == [1]


def test_overwrite_removes_every_record_of_the_earlier_run(outcomes):
    """A stale comm_stats.json must not sit next to the new run's records."""
    run_root, (refused, done) = _outcome(outcomes, "stale_record")
    assert refused.startswith("SetupError") and "comm_stats.json" in refused
    # the file there now, if any, is the new run's (every codec, none included, writes one)
    stats = run_root / "own" / "comm_stats.json"
    assert done["steps"] == 1 and (not stats.exists() or json.loads(stats.read_text()).get("codecs"))


def test_retention_keeps_this_runs_newest_valid_checkpoints(outcomes):
    """Bug 2: a higher-numbered corrupt checkpoint made each new one vanish on save."""
    run_root, (_, resumed) = _outcome(outcomes, "retention")
    ckpts = run_root / "own" / "checkpoints"
    assert resumed["steps"] == 8
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_50", "step_8"]
    run_id = json.loads((run_root / "own" / "run.json").read_text())["run_id"]
    assert json.loads((ckpts / "step_8" / "manifest.json").read_text())["run_id"] == run_id


def test_resuming_a_finished_run_says_so_and_leaves_every_record_as_it_was(outcomes):
    """Issue 29: a resume of a finished run (same run.max_steps) trained 0 steps and replaced
    summary.json with an empty one (final AUC and evals lost). Now it is refused before
    any record is opened; a larger run.max_steps trains on."""
    run_root, (first, again, more) = _outcome(outcomes, "finished")
    assert first["steps"] == 2 and first["final_auc"] is not None
    assert again.startswith("SetupError") and "already finished" in again
    assert "step_2 is at step 2, the planned last step is 2" in again
    before = json.loads((run_root / "records_before.json").read_text())
    assert json.loads(before["summary.json"])["final_auc"] == first["final_auc"]
    assert json.loads((run_root / "records_changed.json").read_text()) == []
    records = _metrics(run_root)
    assert sum(r["kind"] == "resumed" for r in records) == 1  # only the run that trained on
    assert more["steps"] == 3 and [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert not list((run_root / "own").glob(".*.tmp-*"))  # records are written whole


def test_a_resume_without_a_usable_checkpoint_is_refused_and_writes_nothing(outcomes):
    """Issue 34, 1: with every checkpoint damaged, the resume started again from step 0
    in the same folder, a second trajectory appended to metrics.jsonl and mlperf.log and
    summary.json replaced. Now it is refused (exit 2) naming each checkpoint and why."""
    run_root, (first, refused) = _outcome(outcomes, "no_usable_checkpoint")
    assert first["steps"] == 4
    assert refused.startswith("SetupError: cannot resume") and "no usable checkpoint" in refused
    for step in (2, 4):
        assert f"step_{step}/" in refused  # the damaged shard of each, named
    assert refused.count("checksum differs from the manifest") == 2
    assert "second trajectory" in refused and "run.overwrite=true" in refused
    assert "another run.name" in refused
    assert json.loads((run_root / "records_changed.json").read_text()) == []


def test_a_finished_run_without_checkpoints_resumes_as_a_no_op(outcomes):
    """Issue 34, 1: a finished run that kept no checkpoint trained again from step 0 on
    resume. Resumed as it was it is finished (exit 0, nothing written); asked for more
    steps it is refused, since there is nothing to train on from."""
    run_root, (first, again, more) = _outcome(outcomes, "finished_without_checkpoint")
    assert first["steps"] == 2
    assert again.startswith("SetupError (exit 0):") and "already finished" in again
    assert "summary.json records 2 steps" in again and "holds no checkpoint" in again
    assert more.startswith("SetupError: cannot resume") and "it finished at step 2" in more
    assert "the planned last step is 3" in more
    assert json.loads((run_root / "records_changed.json").read_text()) == []


def test_a_run_that_reached_its_target_resumes_as_a_no_op(outcomes):
    """Issue 34: a run that reached its target AUC before its last step, with a checkpoint
    there, trained on past the target when resumed. It is finished: exit 0, nothing
    written."""
    run_root, (first, again) = _outcome(outcomes, "at_target")
    assert first["reached_target"] and first["steps"] < 12, first
    assert (run_root / "own" / "checkpoints" / f"step_{first['steps']}").is_dir()
    assert again.startswith("SetupError (exit 0):") and "already finished" in again, again
    assert f"reached its target AUC 0.5 at step {first['steps']}" in again
    assert json.loads((run_root / "records_changed.json").read_text()) == []


def test_a_torn_last_line_is_set_aside_before_the_resumed_run_appends(outcomes):
    """Issue 34, 4: the `resumed` record was glued onto a torn last line, and the report
    refused the run for good. The torn bytes are kept in metrics.jsonl.torn-1."""
    from dlrmtrain.report import load_run

    run_root, (_, resumed) = _outcome(outcomes, "torn_line")
    assert resumed["steps"] == 3
    records = _metrics(run_root)  # every line is one whole record
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert [r["kind"] for r in records].count("resumed") == 1
    assert (run_root / "own" / "metrics.jsonl.torn-1").read_bytes() == TORN
    assert [r["step"] for r in load_run(run_root / "own").train] == [1, 2, 3]


def test_set_aside_torn_lines_keeps_the_bytes_and_says_so(tmp_path):
    from dlrmtrain.run.records import set_aside_torn_lines

    whole = b'{"kind": "train", "step": 1}\n'
    (tmp_path / "metrics.jsonl").write_bytes(whole + TORN)
    (tmp_path / "metrics.jsonl.torn-1").write_bytes(b"an earlier one")
    (tmp_path / "mlperf.log").write_bytes(b":::MLLOG {}\n")  # whole: left alone
    said: list[str] = []
    assert set_aside_torn_lines(tmp_path, log=said.append) == [tmp_path / "metrics.jsonl.torn-2"]
    assert (tmp_path / "metrics.jsonl").read_bytes() == whole
    assert (tmp_path / "metrics.jsonl.torn-2").read_bytes() == TORN
    assert (tmp_path / "metrics.jsonl.torn-1").read_bytes() == b"an earlier one"
    assert len(said) == 1 and f"{len(TORN)} bytes set aside in metrics.jsonl.torn-2" in said[0]
    assert set_aside_torn_lines(tmp_path, log=said.append) == [] and len(said) == 1


def test_lossless_codec_changes_are_allowed_on_resume_and_recorded(outcomes):
    """Issue 29: none → dedup was refused as "would change the math"; lossless codecs
    train the same model, so the change is allowed and kept in the resumed record.
    A change to a lossy codec is still refused."""
    run_root, (first, dedup, auto, lossy) = _outcome(outcomes, "codec_change")
    assert (first["steps"], dedup["steps"], auto["steps"]) == (2, 4, 6)
    assert dedup["codec"] == "dedup" and auto["codec"] == "auto (t_cat_2: none)"
    markers = [r for r in _metrics(run_root) if r["kind"] == "resumed"]
    assert markers[0]["codec_changes"] == {"comm.codec": ["none", "dedup"]}
    assert markers[0]["config"]["comm"]["codec"] == "dedup"
    assert markers[1]["codec_changes"] == {"comm.codec": ["dedup", "auto"],
                                           "comm.table_codecs": [{}, {"t_cat_2": "none"}]}
    assert lossy.startswith("SetupError") and "comm.codec: 'auto' → 'fp16'" in lossy


def test_resume_refuses_a_checkpoint_trained_with_another_config(outcomes):
    """Bugs 2 and 5: resuming with another learning rate or batch size continued
    silently (at "batch N" of the new size: skipped or repeated data)."""
    run_root, (first, lr, batch) = _outcome(outcomes, "other_config")
    assert first["steps"] == 2
    assert lr.startswith("SetupError") and "optim.lr: 0.05 → 0.1" in lr
    assert batch.startswith("SetupError") and "run.global_batch_size: 256 → 128" in batch
    # Nothing of the refused runs was written: the records end at step 2.
    assert [r["step"] for r in _metrics(run_root) if r["kind"] == "train"] == [1, 2]


def test_unwritable_run_directory_is_found_at_start(outcomes):
    root, results = outcomes
    [result] = results["unwritable"]
    assert result.startswith("SetupError") and "run.output_dir" in result
    assert str(root / "blocked") in result


def _no_step_run(rank, world_size, out_dir, overrides):
    return _runs(out_dir, [overrides])


def test_data_without_one_full_batch_stops_at_once(tmp_path):
    """Bug 1: 200 file rows under a global batch of 256 looped over empty epochs forever
    (writing epoch events to mlperf.log); it must stop at once, saying why."""
    from dlrmtrain.config import load_config
    from dlrmtrain.data.synthetic.files import write_synthetic_dataset

    data = load_config(None, tiny_overrides(str(tmp_path))).data
    write_synthetic_dataset(data, tmp_path / "ds", rows_per_part=200, num_parts=2, progress=False)
    files = ["data.source=criteo", f"data.path={tmp_path / 'ds'}", "data.format=dlrmtrain",
             "data.split=names", "data.train_parts=[day_0]", "data.eval_parts=[day_1]",
             "mlperf.enabled=true"]
    [result] = run_ranks(_no_step_run, 1, str(tmp_path), files, timeout=120)[0]
    assert result.startswith("SetupError")
    assert "200 training rows" in result and "global batch of 256" in result
    assert "world size 1" in result
    run_dir = tmp_path / "own"  # refused before anything was written (but its lock file)
    assert not [p for p in run_dir.iterdir() if p.name not in ("checkpoints", "run.lock")]


def test_partial_checkpoints_of_dead_writers_are_removed(tmp_path):
    import os
    import socket

    from dlrmtrain.run.leftovers import OWNER, remove_dead_partials

    def partial(step, owner):
        path = tmp_path / f"step_{step}.partial"
        path.mkdir()
        if owner is not None:
            (path / OWNER).write_text(json.dumps(owner))
        return path

    host = socket.gethostname()
    dead = partial(3, {"host": host, "pid": 999_999_999})
    nameless = partial(4, None)  # killed before it named its writer
    live = partial(5, {"host": host, "pid": os.getpid()})
    elsewhere = partial(6, {"host": host + "-other", "pid": 1})
    removed = remove_dead_partials(tmp_path, log=lambda _: None)
    assert sorted(removed) == [dead, nameless]
    assert live.exists() and elsewhere.exists()
