"""The pipelined loop (TrainPipelineSparseDist) computes what the plain loop does."""

from __future__ import annotations

import pytest

from tests.multiproc import run_ranks
from tests.multiproc.test_train_ranks import _train

# 4096 samples / 256 per step = 16 steps per epoch: 20 steps cross an epoch end
# (the pipeline drains and refills) and evals every 4 steps interrupt it.
RUN = ["run.max_steps=20", "run.epochs=2", "eval.evals_per_epoch=4"]


def test_pipelined_and_plain_losses_agree(tmp_path):
    plain, _ = run_ranks(_train, 2, str(tmp_path / "plain"), RUN + ["run.pipeline=false"],
                         timeout=240)
    piped, _ = run_ranks(_train, 2, str(tmp_path / "piped"), RUN + ["run.pipeline=true"],
                         timeout=240)
    assert [s for s, _ in piped["losses"]] == list(range(1, 21))
    assert [l for _, l in piped["losses"]] == pytest.approx([l for _, l in plain["losses"]],
                                                            rel=1e-6, abs=1e-7)
    assert [e["auc"] for e in piped["evals"]] == pytest.approx(
        [e["auc"] for e in plain["evals"]], abs=1e-6)
