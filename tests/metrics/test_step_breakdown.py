"""The step-time breakdown (metrics/step_breakdown.py) counts, inside `data`, the time the step
waited for the loader's next batch, over its measured steps only."""

from __future__ import annotations

import time

import torch

from dlrmtrain.metrics.step_breakdown import NoStepBreakdown, StepBreakdown


def test_the_wait_for_input_is_reported_inside_data_for_the_measured_steps():
    timer = StepBreakdown(torch.device("cpu"), first_step=2, num_steps=2)
    for step in (1, 2, 3, 4):
        timer.step_begins(step)
        with timer.phase("data"):
            with timer.waiting_for_input():
                time.sleep(0.6 if step == 1 else 0.01)  # step 1: before the window, not counted
            time.sleep(0.01)  # e.g. the copy to the device: data, not waiting
        timer.step_ends()
    timer.close()
    report = timer.report()
    assert report["steps_measured"] == 2
    # a wall clock: the waits counted are the two measured steps' sleeps, not the first one's
    assert 0.01 * 1000 <= report["input_wait_ms_per_step"] < report["phase_ms_per_step"]["data"]
    assert report["input_wait_ms_per_step"] < 0.3 * 1000  # step 1 would add 300 ms a step
    assert "waiting for input" in timer.render()
    with NoStepBreakdown().waiting_for_input():  # the stand-in takes the same calls
        pass
