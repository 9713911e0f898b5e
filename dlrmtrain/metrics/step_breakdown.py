"""Where a training step's time goes: data (and inside it the wait for the loader's next
batch), forward, backward, optimizer, and the collectives inside them (embedding
all-to-alls, gradient all-reduce).

Phases are timed with the wall clock, synchronising the GPU at each boundary
(which is why this runs only on request: `logging.step_breakdown=true`).
Collectives run inside forward and backward on the backend's own threads or
streams, so their time comes from the torch profiler over a window of steps:
Gloo records `gloo:all_to_all` etc. with the real duration on its worker
thread, NCCL its kernels on the GPU.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import defaultdict
from typing import Iterator

import torch
from torch.profiler import ProfilerActivity, profile

# The pipelined loop cannot split forward / backward / optimizer: it times the
# whole step as one phase.
PHASES = ("data", "forward", "backward", "optimizer", "pipelined step")
_COLLECTIVE = re.compile(r"(gloo|nccl)[:_].*?(all_?to_?all|reduce_?scatter|all_?gather|all_?reduce)",
                         re.IGNORECASE)


def collective_category(name: str) -> str | None:
    """The collective a profiler event is (by its backend's name for it), or None."""
    m = _COLLECTIVE.search(name)
    if not m:
        return None
    op = m.group(2).lower().replace("_", "")
    return {"alltoall": "all_to_all (embeddings)", "allreduce": "all_reduce (dense grads)",
            "reducescatter": "reduce_scatter (row-wise emb)",
            "allgather": "all_gather"}[op]


class StepBreakdown:
    """Accumulates per-phase wall time over the profiled window of steps."""

    def __init__(self, device: torch.device, first_step: int = 3, num_steps: int = 10) -> None:
        self.device = device
        self.first_step = first_step
        self.num_steps = num_steps
        self.phase_seconds: dict[str, float] = defaultdict(float)
        self.comm_seconds: dict[str, float] = defaultdict(float)
        self.input_wait_seconds = 0.0
        """inside `data`: the time the step waited for the loader's next batch"""
        self.steps_measured = 0
        self._profiler: profile | None = None
        self._active = False

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step_begins(self, step: int) -> None:
        """Call before fetching the data of 1-based `step`."""
        if step == self.first_step:
            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._profiler = profile(activities=activities)
            self._profiler.__enter__()
            self._active = True
        if self._active and step >= self.first_step + self.num_steps:
            self._finish()

    def step_ends(self) -> None:
        if self._active:
            self.steps_measured += 1

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self._active:
            yield
            return
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        self.phase_seconds[name] += time.perf_counter() - t0

    @contextlib.contextmanager
    def waiting_for_input(self) -> Iterator[None]:
        """Around taking the loader's next batch (no device sync: the host waits for the
        loader's workers, or makes the batch itself without them)."""
        if not self._active:
            yield
            return
        t0 = time.perf_counter()
        yield
        self.input_wait_seconds += time.perf_counter() - t0

    def _finish(self) -> None:
        self._active = False
        prof, self._profiler = self._profiler, None
        prof.__exit__(None, None, None)
        for event in prof.events():
            cat = collective_category(event.name)
            if cat is None:
                continue
            us = event.device_time_total if self.device.type == "cuda" else event.cpu_time_total
            self.comm_seconds[cat] += us / 1e6

    def close(self) -> None:
        if self._active:
            self._finish()

    def report(self) -> dict:
        n = max(self.steps_measured, 1)
        return {
            "steps_measured": self.steps_measured,
            "phase_ms_per_step": {p: 1000 * self.phase_seconds[p] / n for p in PHASES
                                  if p in self.phase_seconds},
            "collective_ms_per_step": {k: 1000 * v / n for k, v in sorted(self.comm_seconds.items())},
            "input_wait_ms_per_step": 1000 * self.input_wait_seconds / n,
        }

    def render(self) -> str:
        r = self.report()
        total = sum(r["phase_ms_per_step"].values()) or 1.0
        lines = [f"step-time breakdown (rank 0, mean of {r['steps_measured']} steps):"]
        for p, ms in r["phase_ms_per_step"].items():
            lines.append(f"  {p:<28} {ms:8.2f} ms  {100 * ms / total:5.1f}%")
            if p == "data":
                lines.append(f"    {'waiting for input':<26} {r['input_wait_ms_per_step']:8.2f} ms")
        lines.append("  collectives (inside forward/backward):")
        for k, ms in r["collective_ms_per_step"].items():
            lines.append(f"    {k:<26} {ms:8.2f} ms")
        if not r["collective_ms_per_step"]:
            lines.append("    (none recorded: a single rank has no collectives)")
        return "\n".join(lines)


class NoStepBreakdown:
    """Stand-in when the breakdown is off: every call is free."""

    def step_begins(self, step: int) -> None:
        pass

    def step_ends(self) -> None:
        pass

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def waiting_for_input(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass
