"""dlrmv4's eval grid: the closed rules' spacing and first eval, and the reference's skip knob."""

from __future__ import annotations

import pytest

from dlrmtrain.mlperf.eval_grid import EvalGrid, eval_grid_for_config
from tests.mlperf.simulated_run import OFFICIAL_DLRMV4, dlrmv4_config

TRAIN = OFFICIAL_DLRMV4.train_samples


@pytest.mark.parametrize("batch,interval,first_block", [
    # closed_dlrmv4.yaml: "block 25, 31 and 41 at global batch 8192, 16384 and 32768";
    # the reference's gin: 280 / 140 / 70 steps per eval, 2,293,760 samples at each.
    (8192, 280, 25), (16384, 140, 31), (32768, 70, 41)])
def test_official_grid_and_first_eval_are_the_rules(batch, interval, first_block):
    grid = EvalGrid.build(TRAIN, batch, 0.001)
    assert grid.interval_steps == interval
    assert grid.interval_samples == 2_293_760
    assert grid.first_eval_step == first_block * interval


def test_the_references_skip_default_lands_on_the_rules_first_eval_at_8192():
    # yambda_5b.gin: SKIP_EVAL_EPOCH_PCT 0.025 is "the GBS=8192 value" (first eval run: #25).
    assert EvalGrid.build(TRAIN, 8192, 0.001, 0.025).first_eval_step \
        == EvalGrid.build(TRAIN, 8192, 0.001).first_eval_step


def test_eval_steps_are_the_grid_from_the_first_eval():
    grid = EvalGrid.build(32768, 256, 0.05, 0.2)  # every ceil(6.4) = 7 steps, from ceil(25.6) = 26
    assert (grid.interval_steps, grid.first_eval_step) == (7, 28)
    assert [s for s in range(1, 60) if grid.is_eval_step(s)] == [28, 35, 42, 49, 56]
    assert grid.samples_count(28) == 28 * 256
    assert grid.skip_eval_epoch_pct == 0.2
    assert EvalGrid.build(32768, 256, 0.05, 0.0).first_eval_step == 7  # never at step 0


def test_a_grid_the_run_never_reaches_is_refused_naming_the_key():
    cfg = dlrmv4_config(OFFICIAL_DLRMV4, {"mlperf.skip_eval_epoch_pct": None,
                                          "run.global_batch_size": 256})
    with pytest.raises(ValueError, match="set mlperf.skip_eval_epoch_pct"):
        eval_grid_for_config(cfg, 32768)  # the official first eval is 45.8 M samples in
    with pytest.raises(ValueError, match="mlperf.eval_every_data_pct"):
        EvalGrid.build(32768, 256, 0.0, 0.2)
    with pytest.raises(ValueError, match="mlperf.skip_eval_epoch_pct"):
        EvalGrid.build(32768, 256, 0.05, 1.0)
