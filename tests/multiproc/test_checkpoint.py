"""Checkpoint and resume: N steps + resume + N steps is the 2N-step run, and a
damaged checkpoint is refused in favour of the previous one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.common import tiny_config
from tests.multiproc import run_ranks

# 16 steps per epoch; the split at step 10 is mid-epoch, 2N = 20 crosses an epoch.
BASE = ["run.epochs=2", "eval.evals_per_epoch=0", "eval.enabled=false", "optim.name=adagrad",
        "checkpoint.every_steps=5"]


def _train_and_weights(rank, world_size, out_dir, overrides):
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from dlrmtrain.validation import resolve_config, validate_config
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.trainer import Trainer

    cfg = resolve_config(tiny_config(out_dir, *overrides))
    validate_config(cfg, world_size)
    trainer = Trainer(cfg, init_distributed("cpu"))
    start_step = trainer.step
    summary = trainer.train().as_dict()
    weights = {}
    for key, value in trainer.model.state_dict().items():
        if isinstance(value, ShardedTensor):
            for i, shard in enumerate(value.local_shards()):
                weights[f"{key}#{i}"] = shard.tensor.clone()
        else:
            weights[key] = value.clone()
    trainer.close()
    del trainer
    return start_step, summary, weights


def _run(tmp_path, name, *overrides):
    return run_ranks(_train_and_weights, 2, str(tmp_path), BASE + [f"run.name={name}", *overrides],
                     timeout=240)


@pytest.fixture(scope="module")
def ten_steps(tmp_path_factory) -> Path:
    """One 10-step run ("split", checkpoints at steps 5 and 10); each test copies it."""
    out = tmp_path_factory.mktemp("ten_steps")
    _run(out, "split", "run.max_steps=10")
    return out / "split"


def _copy_run(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / run_dir.name))


def test_resume_continues_the_same_trajectory(tmp_path, ten_steps):
    full = _run(tmp_path, "full", "run.max_steps=20")
    _copy_run(ten_steps, tmp_path)
    resumed = _run(tmp_path, "split", "run.max_steps=20", "checkpoint.resume=true")
    for rank in range(2):
        start, summary, weights = resumed[rank]
        assert start == 10
        _, full_summary, full_weights = full[rank]
        assert summary["losses"] == full_summary["losses"][10:]  # steps 11..20, same values
        assert weights.keys() == full_weights.keys()
        for key in weights:  # the same operations in the same order: bitwise equal
            assert torch.equal(weights[key], full_weights[key]), key


def test_damaged_checkpoint_is_refused_and_the_previous_one_used(tmp_path, ten_steps):
    ckpts = _copy_run(ten_steps, tmp_path) / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_10", "step_5"]
    shard = next(p for p in sorted((ckpts / "step_10").iterdir()) if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # cut mid-file
    # A save that died before its commit leaves only a .partial folder: never used.
    (ckpts / "step_15.partial").mkdir()
    resumed = _run(tmp_path, "split", "run.max_steps=12", "checkpoint.resume=true",
                   "checkpoint.every_steps=0")
    assert [start for start, _, _ in resumed] == [5, 5]
    log = (tmp_path / "split" / "metrics.jsonl").read_text()
    assert "train" in log


def test_verify_names_the_truncated_file(tmp_path, ten_steps):
    from dlrmtrain.run.checkpoint import verify_checkpoint

    ckpt = Path(shutil.copytree(ten_steps / "checkpoints" / "step_5", tmp_path / "step_5"))
    assert verify_checkpoint(ckpt) is None
    victim = ckpt / "trainer_state.json"
    victim.write_text(victim.read_text()[:-3])
    problem = verify_checkpoint(ckpt)
    assert "trainer_state.json" in problem and "truncated" in problem
