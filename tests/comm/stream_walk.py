"""Which tensors a plan holds that its `record_stream` does not reach (checked on CPU).

A plan made ahead on the pipeline's data-dist stream is used on another stream; on CUDA
the caching allocator may hand out again any memory not `record_stream`ed there while a
kernel still reads it (silently wrong rows). `unrecorded_tensors` walks everything the
plan holds with the garbage collector's referents (independently of the plan's own walk),
calls the plan's `record_stream` with `Tensor.record_stream` replaced by a recorder, and
names every held tensor it missed. Long-lived state (the planner behind a deferred
method, process groups, works, futures) is not the plan's and is not walked.
"""

from __future__ import annotations

import gc
import types

import torch
import torch.distributed as dist

_NOT_THE_PLANS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                  dist.ProcessGroup, dist.Work, torch._C.Future, torch.nn.Module)


def held_tensors(root: object) -> list[torch.Tensor]:
    found, seen, todo = [], set(), [root]
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            found.append(o)
        elif not isinstance(o, _NOT_THE_PLANS):
            todo.extend(gc.get_referents(o))
    return found


def unrecorded_tensors(plan: object) -> list[str]:
    """Shapes of the tensors `plan` holds that `plan.record_stream` leaves out."""
    recorded: set[int] = set()
    original = torch.Tensor.record_stream
    torch.Tensor.record_stream = lambda t, stream: recorded.add(id(t))  # CPU tensors have no streams
    try:
        plan.record_stream(object())
    finally:
        torch.Tensor.record_stream = original
    return [f"{tuple(t.shape)} {t.dtype}" for t in held_tensors(plan) if id(t) not in recorded]
