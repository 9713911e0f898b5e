"""scripts/count_codec_ops.py counts the ops that launch work: a `to` or `reshape` that copied
counts, one that returned its input (or a view) does not, nor does an in-place `detach_`."""

from __future__ import annotations

import torch

from tests.scripts import load_script


def test_only_ops_that_launch_work_are_counted():
    script = load_script("count_codec_ops")
    x = torch.randn(4, 3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("step::5"), torch.profiler.record_function("codec::c"):
            x.to(torch.float32)               # returns x: nothing launched
            x.to(torch.float32)
            x.t().reshape(-1)                 # copies
            x.reshape(-1)                     # a view
            x.to(torch.float64)               # copies
            torch.randn(2).detach_()          # randn counts; detach_ launches nothing
            x.t().contiguous()                # copies
    counts = script._count(prof.events(), warmup=3)
    assert counts["ops"] == {"c": 4}, counts
