"""Collective futures that treat callback results as a CUDA future does, on CPU.

A CUDA future (NCCL's) extracts the tensors of whatever a `then` callback returns
(`torch._jit_internal._extract_tensors`) to record their streams, so a callback
that returns anything else (a `Work`, an object holding one) makes `wait()` raise
on GPU. Gloo's futures do not look. `cuda_like_futures()` wraps the async
collectives the codec calls (from dlrmtrain.comm; TorchRec's own are left alone) so that every callback's value goes through the same
extraction: a callback that would fail on CUDA fails here too.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable

import torch.distributed as dist
from torch._jit_internal import _extract_tensors

WRAPPED = ("all_gather", "all_to_all_single", "all_reduce")


class _Future:
    def __init__(self, future: Any, seen: list[int]) -> None:
        self._future, self._seen = future, seen

    def then(self, callback: Callable) -> Any:
        def extracted(done: Any) -> Any:
            value = callback(done)
            _extract_tensors(value)  # raises for what a CUDA future cannot extract
            self._seen.append(1)
            return value
        return self._future.then(extracted)

    def wait(self) -> Any:
        return self._future.wait()


class _Work:
    def __init__(self, work: Any, seen: list[int]) -> None:
        self._work, self._seen = work, seen

    def wait(self, *args: Any) -> Any:
        return self._work.wait(*args)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self) -> _Future:
        return _Future(self._work.get_future(), self._seen)


@contextlib.contextmanager
def cuda_like_futures():
    """Within: async collectives return works whose futures check callback results as CUDA does;
    yields the list that gets one entry per callback checked."""
    seen: list[int] = []
    originals = {name: getattr(dist, name) for name in WRAPPED}

    def wrap(original: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            work = original(*args, **kwargs)
            ours = sys._getframe(1).f_globals.get("__name__", "").startswith("dlrmtrain.comm")
            return _Work(work, seen) if kwargs.get("async_op") and ours else work  # TorchRec's untouched
        return call

    for name, original in originals.items():
        setattr(dist, name, wrap(original))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
