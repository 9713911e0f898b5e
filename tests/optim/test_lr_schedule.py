"""The MLPerf LR policy at its landmarks, against values worked out by hand from
the reference's formulas (facebookresearch/dlrm LRPolicyScheduler)."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.optim.lr_schedule import MLPerfLRSchedule

# MLPerf v1 at batch 55296: lr 24, warmup 2750, decay from 49315 over 27772 steps.
BASE, WARMUP, START, STEPS = 24.0, 2750, 49315, 27772


def rates_at(checkpoints: list[int]) -> dict[int, float]:
    sched = MLPerfLRSchedule(BASE, WARMUP, START, STEPS)
    wanted = set(checkpoints)
    return {s: lr for s in range(1, max(checkpoints) + 1)
            if (lr := sched.lr_at(s)) is not None and s in wanted}


def test_landmarks():
    mid = START + STEPS // 2
    r = rates_at([1, 1375, WARMUP - 1, WARMUP, 10_000, START - 1, START, mid,
                  START + STEPS - 1, START + STEPS, START + STEPS + 500])
    assert r[1] == pytest.approx(BASE / WARMUP)
    assert r[1375] == pytest.approx(BASE * 0.5)
    assert r[WARMUP - 1] == pytest.approx(BASE * (WARMUP - 1) / WARMUP)
    # Warmup is over; the reference holds its last rate until decay starts.
    assert r[WARMUP] == r[10_000] == r[START - 1] == pytest.approx(BASE * (WARMUP - 1) / WARMUP)
    assert r[START] == pytest.approx(BASE)                     # decay starts at full rate
    assert r[mid] == pytest.approx(BASE * ((STEPS - STEPS // 2) / STEPS) ** 2)
    last = max(1e-7, BASE * (1 / STEPS) ** 2)  # the reference floors the rate at 1e-7
    assert last == 1e-7
    assert r[START + STEPS - 1] == pytest.approx(last)
    # After the decay the last rate is frozen (never negative, never back up).
    assert r[START + STEPS] == r[START + STEPS + 500] == pytest.approx(last)


def test_constant_without_warmup_or_decay():
    sched = MLPerfLRSchedule(0.005)
    assert sched.rates(range(1, 50)) == [0.005] * 49


def test_decay_towards_end_lr_and_floor():
    sched = MLPerfLRSchedule(1.0, warmup_steps=0, decay_start_step=10, decay_steps=4, end_lr=0.2)
    rates = sched.rates(range(1, 16))
    assert rates[9:14] == pytest.approx([1.0, 0.2 + 0.8 * (3 / 4) ** 2, 0.2 + 0.8 * (2 / 4) ** 2,
                                         0.2 + 0.8 * (1 / 4) ** 2, 0.2 + 0.8 * (1 / 4) ** 2])


def test_decay_before_warmup_end_is_rejected():
    with pytest.raises(ValueError, match="decay_start_step"):
        MLPerfLRSchedule(1.0, warmup_steps=100, decay_start_step=50, decay_steps=10)


def test_apply_sets_every_param_group():
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]]}], lr=9.0)
    sched = MLPerfLRSchedule(2.0, warmup_steps=4)
    assert sched.apply(1, [opt]) == pytest.approx(0.5)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5, 0.5])
