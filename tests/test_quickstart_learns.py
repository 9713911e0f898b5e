"""A small config learns: the eval AUC ends well above chance and above a
dense-features-only baseline."""

from __future__ import annotations

from tests.multiproc import run_ranks
from tests.multiproc.test_train_ranks import _train

# Stated target for this config (the synthetic teacher reaches ~0.86; using
# only the dense features gives ~0.62).
TARGET_AUC = 0.70


def test_small_config_reaches_its_target_auc(tmp_path):
    overrides = [
        "model.embedding_dim=16", "model.bottom_mlp=[32,16]", "model.top_mlp=[32,16,1]",
        "data.table_sizes=" + str([4000, 200, 6000, 3000, 30, 5, 1200, 60, 3, 2000, 800,
                                   5000, 600, 10, 1000, 4000, 4, 400, 200, 3, 4500, 8, 9,
                                   1800, 20, 1400]),
        "data.synthetic.num_train_samples=131072", "data.synthetic.num_eval_samples=8192",
        "run.global_batch_size=1024", "eval.batch_size=4096", "eval.evals_per_epoch=2",
        f"eval.target_auc={TARGET_AUC}", "optim.lr=0.03", "logging.metrics_every_steps=32",
    ]
    summary, _ = run_ranks(_train, 2, str(tmp_path), overrides, timeout=300)
    assert summary["final_auc"] >= TARGET_AUC, summary["evals"]
    assert summary["reached_target"]
    assert summary["evals"][0]["auc"] > 0.6
