"""bf16 mixed precision trains: the loss falls, and it is really a different
numeric path from fp32 (the losses are not identical)."""

from __future__ import annotations

from tests.multiproc import run_ranks
from tests.multiproc.test_train_ranks import _train

RUN = ["run.max_steps=16", "eval.evals_per_epoch=0", "optim.lr=0.1"]


def _bf16_then_fp32(rank: int, world_size: int, out_dir: str) -> dict:
    """Both precisions in one spawned group: a spawn and its imports cost as much as a run."""
    return {"bf16": _train(rank, world_size, f"{out_dir}/bf16", RUN + ["precision.mode=bf16"]),
            "fp32": _train(rank, world_size, f"{out_dir}/fp32", RUN)}


def test_bf16_trains_and_differs_from_fp32(tmp_path):
    runs, _ = run_ranks(_bf16_then_fp32, 2, str(tmp_path), timeout=300)
    bf16, fp32 = runs["bf16"], runs["fp32"]
    losses = [loss for _, loss in bf16["losses"]]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.02
    assert bf16["final_auc"] > 0.55  # chance is 0.5; 16 tiny steps reach ~0.6
    assert losses != [loss for _, loss in fp32["losses"]]
