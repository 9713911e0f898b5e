"""Every run.pipeline choice trains bitwise the plain loop's numbers (2 real Gloo ranks,
one launch): codecs none and dedup (at the owner, and at the source: the loader's
variable-batch KJT through the pipelines' copy and input dist), table- and row-wise tables,
DLRM v1 and DCNv2, under a
rate that changes every step (warmup, then decay: fbgemm's fused table update takes the rate
set before its lookup, which the fused pipeline starts early)."""

from __future__ import annotations

from tests.common import tiny_overrides, train_on_rank
from tests.multiproc import run_ranks

# 4096 samples / 256 per step = 16 steps per epoch: 20 steps cross an epoch end (the
# pipeline drains and refills) and evals every 4 steps detach and re-attach it. The rate
# warms up over 6 steps and decays from step 10 (MLPerf DLRM v1's schedule, scaled down).
RUN = ["run.max_steps=20", "run.epochs=2", "eval.evals_per_epoch=4", "optim.warmup_steps=6",
       "optim.decay_start_step=10", "optim.decay_steps=10",
       "sharding.tables={t_cat_2: row_wise, t_cat_9: row_wise}"]
SOURCE = ["comm.codec=dedup", "comm.dedup_at=source", "optim.name=sgd"]
"""dedup at the source (SGD: fbgemm's variable-batch TBE does not train Adagrad)"""
RUNS = {  # name: (pipeline, the run's other overrides)
    "none/off": ("off", []),
    "none/sparse_dist": ("sparse_dist", []),
    "none/fused_sparse_dist": ("fused_sparse_dist", []),
    "dedup dcnv2/off": ("off", ["comm.codec=dedup", "comm.dedup_at=owner", "model.arch=dlrm_dcnv2"]),
    "dedup dcnv2/fused_sparse_dist": ("fused_sparse_dist", ["comm.codec=dedup", "comm.dedup_at=owner",
                                                           "model.arch=dlrm_dcnv2"]),
    "source/off": ("off", SOURCE),
    "source/sparse_dist": ("sparse_dist", SOURCE),
    "source/fused_sparse_dist": ("fused_sparse_dist", SOURCE),
}


def _train_every_pipeline(rank: int, world_size: int, out_dir: str) -> dict:
    return {name: train_on_rank(rank, world_size, None, tiny_overrides(
                out_dir, *RUN, *extra, f"run.pipeline={pipeline}",
                f"run.name={name.replace(' ', '_').replace('/', '_')}"))
            for name, (pipeline, extra) in RUNS.items()}


def test_every_pipeline_trains_the_plain_loops_numbers(tmp_path):
    summaries, _ = run_ranks(_train_every_pipeline, 2, str(tmp_path), timeout=400)
    for name, run in summaries.items():
        plain = summaries[name.split("/")[0] + "/off"]
        assert [s for s, _ in run["losses"]] == list(range(1, 21)), name
        assert run["losses"] == plain["losses"], name  # bitwise: the same floats
        assert [e["auc"] for e in run["evals"]] == [e["auc"] for e in plain["evals"]], name
        assert len(run["evals"]) == 5, name  # steps 4, 8, 12, 16 and the last
    # the pairs differ from each other: the codec and model changes reached the runs
    assert summaries["none/off"]["losses"] != summaries["dedup dcnv2/off"]["losses"]
    assert summaries["none/off"]["losses"] != summaries["source/off"]["losses"]
