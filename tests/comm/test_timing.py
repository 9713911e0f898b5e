"""comm/timing.py: CUDA-event timing where the device is CUDA, the host clock on CPU.

The GPU rule imitated on CPU: a fake event class injected through the seam
(`timing.event_type`) stands in for `torch.cuda.Event`, and the host clock raises if
read. On a "cuda" device the transports' waits and codec spans and auto's step
periods record events, no step reads an event, and the elapsed times reach the
comm stats when they are read and auto's policy at its decision.
"""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.comm import timing
from dlrmtrain.comm.auto.policy import AutoPolicy
from dlrmtrain.comm.dedup.transport import count_codec, timed_wait
from dlrmtrain.comm.stats import DistCommStats

CUDA = torch.device("cuda")  # a device object only: nothing here runs on a GPU


class FakeEvent:
    """`torch.cuda.Event`'s timing surface; its clock is the order of `record` calls (1 ms apart)."""

    clock = 0
    reads = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: int | None = None

    def record(self, stream=None) -> None:
        FakeEvent.clock += 1
        self.at = FakeEvent.clock

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        FakeEvent.reads += 1

    def elapsed_time(self, end: "FakeEvent") -> float:
        return float(end.at - self.at)  # ms


@pytest.fixture
def fake_gpu(monkeypatch):
    FakeEvent.clock = FakeEvent.reads = 0
    monkeypatch.setattr(timing, "event_type", FakeEvent)

    def no_host_clock():
        raise AssertionError("the host clock was read on a cuda device")

    monkeypatch.setattr(timing.time, "perf_counter", no_host_clock)
    return FakeEvent


class _Work:
    def wait(self) -> None:
        FakeEvent.clock += 2  # the stream waits 2 ms more than the event pair around it marks


def test_on_cuda_waits_and_codec_spans_record_events_read_only_with_the_stats(fake_gpu):
    stats = DistCommStats(codec="dedup", sharding_type="table_wise")
    t0 = timed_wait(_Work(), stats, CUDA, "rail fwd")  # events at 1, then 4 (the wait's 2 in between)
    count_codec(stats, t0, CUDA, "expand")              # from 4 to 5
    stats.add_time(None, timing.since(timing.stamp(CUDA), CUDA)[0], "ids")  # a hop alone: 6 to 7
    assert stats.transfer_seconds == stats.codec_seconds == 0.0 and fake_gpu.reads == 0
    assert len(stats.unread_times) == 3  # nothing read during the step: no sync added
    total = DistCommStats(codec="dedup", sharding_type="table_wise")
    total.add(stats)  # a plan made ahead hands its unread times on
    total.settle()
    assert total.transfer_seconds == pytest.approx(3e-3) and total.codec_seconds == pytest.approx(1e-3)
    assert total.hop_seconds == pytest.approx({"rail fwd": 3e-3, "expand": 1e-3, "ids": 1e-3})
    assert total.unread_times == [] and fake_gpu.reads == 3


def test_unread_times_stay_bounded_without_a_sync(fake_gpu):
    stats = DistCommStats(codec="dedup", sharding_type="table_wise")
    for _ in range(1000):
        timed_wait(_Work(), stats, CUDA)
    assert len(stats.unread_times) < 300  # completed events (query) are added in as they pile up
    assert stats.settle().transfer_seconds == pytest.approx(1000 * 3e-3)


def test_auto_reads_device_step_times_only_at_its_decision(fake_gpu):
    policy = AutoPolicy(warmup_steps=1, probe_steps=2, min_probe_steps=2)
    start = timing.stamp(CUDA)
    while not policy.needs_decision():
        FakeEvent.clock += 10 if policy.path() == "none" else 2  # none's steps take longer on the device
        now = timing.stamp(CUDA)
        policy.observe(timing.elapsed(start, now))
        start = now
    assert fake_gpu.reads == 0  # every step observed, none read
    none_s, dedup_s = policy.local_medians()
    assert (none_s, dedup_s) == pytest.approx((11e-3, 3e-3)) and fake_gpu.reads > 0
    assert policy.decide(none_s, dedup_s).choice == "dedup"


def test_on_cpu_times_are_host_floats_as_before():
    stats = DistCommStats(codec="dedup", sharding_type="table_wise")
    cpu = torch.device("cpu")
    t0 = timing.stamp(cpu)
    assert isinstance(t0, float)
    t1 = timed_wait(_Work(), stats, cpu, "rail fwd")
    assert isinstance(t1, float) and stats.unread_times == []
    assert stats.transfer_seconds == stats.hop_seconds["rail fwd"] > 0.0
    assert timing.elapsed(1.0, 3.5, (0.5,)) == 2.0 and timing.elapsed(1.0, 3.5) == 2.5
