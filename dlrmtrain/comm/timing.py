"""Time on the data's device: the host clock on CPU, CUDA events on CUDA, read lazily.

On CUDA a collective's `work.wait()` only makes the current stream wait and a kernel
launch returns at once, so a host clock around them reads launch costs (~0), not the
transfer or the kernel. A stamp on CUDA is therefore an event recorded on the current
stream (`torch.cuda.Event(enable_timing=True)`), and the time between two stamps is
read only where the host waits anyway: when the comm stats are read
(`DistCommStats.settle`) and at `auto`'s decisions (the policy reads its samples with
`float()` right before agreeing them over ranks). Recording an event never syncs, so
timing adds no host sync to a step. On CPU a stamp is `time.perf_counter()` and an
elapsed time is a plain float, as before this module existed.
"""

from __future__ import annotations

import time
from typing import Any

import torch

event_type: Any = torch.cuda.Event
"""what a CUDA stamp records: the seam a CPU test replaces to imitate the GPU"""

Stamp = Any
"""a `perf_counter()` float (host) or a recorded `event_type` (CUDA)"""


def stamp(device: torch.device) -> Stamp:
    """Now, on `device`'s clock: an event recorded on its current stream, or the host clock."""
    if device.type != "cuda":
        return time.perf_counter()
    event = event_type(enable_timing=True)
    event.record()
    return event


class DeviceInterval:
    """The time between two CUDA stamps (minus others' `less`), read on the first `float()`."""

    def __init__(self, start: Any, end: Any, less: tuple[DeviceInterval | float, ...] = ()) -> None:
        self.start, self.end, self.less = start, end, less
        self._seconds: float | None = None

    def done(self) -> bool:
        """Whether reading it now would not wait (the events have completed; never syncs)."""
        return self._seconds is not None or (self.end.query() and all(
            not isinstance(x, DeviceInterval) or x.done() for x in self.less))

    def __float__(self) -> float:
        if self._seconds is None:
            self.end.synchronize()  # where the caller syncs anyway (see the module docstring)
            self._seconds = self.start.elapsed_time(self.end) / 1e3 - sum(float(x) for x in self.less)
        return self._seconds


Elapsed = float | DeviceInterval
"""seconds between two stamps: a float on the host, a `DeviceInterval` on CUDA"""


def elapsed(start: Stamp, end: Stamp, less: tuple[Elapsed, ...] = ()) -> Elapsed:
    """`end - start - sum(less)`: at once between host stamps, lazily between CUDA ones."""
    if isinstance(start, float):
        return end - start - sum(less) if less else end - start
    return DeviceInterval(start, end, less)


def since(start: Stamp, device: torch.device) -> tuple[Elapsed, Stamp]:
    """The time from `start` until now on `device`, and now."""
    now = stamp(device)
    return elapsed(start, now), now
