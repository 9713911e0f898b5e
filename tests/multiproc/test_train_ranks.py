"""The trainer on real Gloo ranks: ranks agree, and N ranks match 1 rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlrmtrain.config import load_config
from tests.common import tiny_overrides, train_on_rank
from tests.multiproc import run_ranks


def _train(rank: int, world_size: int, out_dir: str, overrides: list[str]) -> dict:
    return train_on_rank(rank, world_size, None, tiny_overrides(out_dir, *overrides))


AGREE = ["run.max_steps=6", "eval.evals_per_epoch=0", "run.name=agree"]
MATCH = ["run.max_steps=5", "eval.enabled=false"]
BREAKDOWN = ["run.max_steps=14", "eval.enabled=false", "logging.step_breakdown=true", "run.name=bd"]
BUCKETS_MB = (0.25, 25)  # a fraction: a dense part under a megabyte (the mini DLRMv4)


def _two_rank_scenarios(rank: int, world_size: int, out_dir: str) -> dict:
    """Every 2-rank run of this module in one spawned group (a spawn and its imports
    cost more than these few steps)."""
    out = Path(out_dir)
    return {"agree": _train(rank, world_size, str(out / "agree"), AGREE),
            "match": _train(rank, world_size, str(out / "match"), MATCH),
            "breakdown": _train(rank, world_size, str(out / "breakdown"), BREAKDOWN),
            "bucket_bytes": [_ddp_bucket_bytes(rank, world_size, str(out / "buckets"), mb)
                             for mb in BUCKETS_MB]}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("two_ranks")
    return run_ranks(_two_rank_scenarios, 2, str(out), timeout=300), out


def test_two_ranks_agree_and_write_the_run_directory(two_ranks):
    ranks, out = two_ranks
    rank0, rank1 = (r["agree"] for r in ranks)
    assert len(rank0["losses"]) == 6
    assert rank0["losses"] == rank1["losses"]          # global mean loss, same on both
    assert rank0["final_auc"] == rank1["final_auc"]   # one final eval over all samples
    run_dir = out / "agree" / "agree"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "train"] == list(range(1, 7))
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 6
    assert (run_dir / "config.yaml").is_file()


def test_two_ranks_match_one_rank_on_the_same_global_batches(two_ranks, tmp_path):
    (single,) = run_ranks(_train, 1, str(tmp_path / "one"), MATCH, timeout=180)
    losses_1 = [loss for _, loss in single["losses"]]
    losses_2 = [loss for _, loss in two_ranks[0][0]["match"]["losses"]]
    # Same model, same data; only float summation order differs across ranks.
    assert losses_2 == pytest.approx(losses_1, rel=1e-5, abs=1e-6)
    assert losses_1[0] != losses_1[-1]  # it did train


def test_step_breakdown_on_request(two_ranks):
    report = json.loads((two_ranks[1] / "breakdown" / "bd" / "step_breakdown.json").read_text())
    assert report["steps_measured"] == 10
    assert all(ms > 0 for ms in report["phase_ms_per_step"].values())
    assert 0 < report["input_wait_ms_per_step"] <= report["phase_ms_per_step"]["data"]
    # Table-wise embeddings cross ranks by all-to-all; dense grads by all-reduce.
    assert report["collective_ms_per_step"]["all_to_all (embeddings)"] > 0
    assert report["collective_ms_per_step"]["all_reduce (dense grads)"] > 0


def _ddp_bucket_bytes(rank: int, world_size: int, out_dir: str, bucket_mb: float) -> int:
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config, validate_config

    cfg = resolve_config(load_config(None, tiny_overrides(out_dir, f"run.ddp_bucket_mb={bucket_mb}",
                                                          f"run.name=b{bucket_mb}")))
    validate_config(cfg, world_size)
    trainer = Trainer(cfg, init_distributed("cpu"))
    ddp = trainer.model._dmp_wrapped_module  # DMP wraps the dense part in DDP
    cap = ddp.bucket_bytes_cap
    trainer.close()
    del trainer, ddp
    return cap


def test_ddp_bucket_size_reaches_the_dense_all_reduce(two_ranks):
    for rank in two_ranks[0]:
        assert rank["bucket_bytes"] == [mb * 1024 * 1024 for mb in BUCKETS_MB]
