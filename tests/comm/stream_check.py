"""CUDA's stream rule checked on CPU: what crosses streams is `record_stream`ed, every tensor of it.

`observed_records` replaces `comm.streams.record_tensor` (a no-op on CPU) with a recorder and
makes `current_stream` a stand-in, so a CPU run sees every call a CUDA run would make.
`reachable_tensors` finds an object's tensors independently of `streams.held_tensors`: through
the garbage collector's referents (as `torch._jit_internal._extract_tensors` finds a CUDA
future's tensors by pickling, which cannot follow a closure), so a holder that
`held_tensors` does not know shows up as unrecorded.
"""

from __future__ import annotations

import functools
import gc
import types
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

from dlrmtrain.comm import streams

STREAM = object()
"""the stand-in stream (`Tensor.record_stream` needs CUDA)"""
_NOT_OURS = (type, types.ModuleType, nn.Module, torch.Future, dist.ProcessGroup, dist.Work)


@contextmanager
def observed_records() -> Iterator[list[tuple[torch.Tensor, Any]]]:
    """Inside: every (tensor, stream) given to `streams.record_tensor`; the current stream is `STREAM`."""
    calls: list[tuple[torch.Tensor, Any]] = []
    record, current = streams.record_tensor, streams.current_stream
    streams.record_tensor = lambda tensor, stream: calls.append((tensor, stream))
    streams.current_stream = lambda device: STREAM
    try:
        yield calls
    finally:
        streams.record_tensor, streams.current_stream = record, current


def reachable_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor the garbage collector sees reachable from `obj` (not through modules, process
    groups, works, futures, types, a function's globals, or a partial's function: the planner
    method a two-level plan defers to is long-lived state, which needs no record)."""
    seen, found, stack = set(), [], [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, _NOT_OURS):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            found.append(item)
            continue
        referents = gc.get_referents(item)
        if isinstance(item, functools.partial):  # deferred work: its arguments are the step's
            referents = [*item.args, item.keywords]
        if isinstance(item, types.FunctionType):
            referents = [r for r in referents if r is not item.__globals__ and r is not item.__builtins__]
        stack.extend(referents)
    return found


def unrecorded(obj: Any, holds: Any = None) -> tuple[int, int]:
    """(tensors `holds` (default: obj) holds, how many of them `obj.record_stream(STREAM)` missed)."""
    found = reachable_tensors(obj if holds is None else holds)
    with observed_records() as calls:
        obj.record_stream(STREAM)
    recorded = {id(t) for t, stream in calls if stream is STREAM}
    return len(found), sum(id(t) not in recorded for t in found)
