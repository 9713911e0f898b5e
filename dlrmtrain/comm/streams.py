"""Keeping a codec's memory alive across CUDA streams (`record_stream` over everything an object holds).

Under TorchRec's pipeline a dedup plan is made on the data-dist stream and
used, a step later, on the default one. The caching allocator hands memory
back to the stream that allocated it as soon as the last Python reference
goes; without `Tensor.record_stream` onto the stream that still reads it, a
lookup or collective may read recycled memory (silently wrong rows).
`record_stream(obj, stream)` reaches every tensor `obj` holds: through
attributes, dataclass fields, containers, and the cells of a closure (or the
arguments of a `functools.partial`) that holds deferred work. Every tensor goes through `record_tensor`, which is a
no-op where memory has no streams (CPU), so a CPU test can observe the calls.

Not walked: modules (their parameters are TorchRec's), process groups and
works, and futures (a CUDA future records its value's streams itself, as
`torch._jit_internal._extract_tensors` also assumes).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import types
from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn as nn

_LEAVES = (str, bytes, int, float, complex, bool, type(None), torch.device, torch.dtype, torch.Size, type,
           types.ModuleType, types.CodeType, nn.Module, torch.Future, dist.ProcessGroup, dist.Work,
           type(threading.Lock()), threading.Thread, range)
"""what holds no tensor of its own (or whose tensors are not ours to record)"""


def record_tensor(tensor: torch.Tensor, stream: Any) -> None:
    """Tell the caching allocator that `stream` uses `tensor`; CPU (and meta) memory has no streams."""
    if stream is not None and tensor.device.type not in ("cpu", "meta"):
        tensor.record_stream(stream)


def current_stream(device: torch.device) -> Any:
    """The current stream of `device` (None where there are none: CPU)."""
    if device.type in ("cpu", "meta"):
        return None
    return torch.get_device_module(device).current_stream(device)


def record_stream(obj: Any, stream: Any) -> None:
    """`record_tensor(t, stream)` for every tensor `obj` holds (`held_tensors`)."""
    if stream is None:  # no streams (CPU): nothing to record, no walk on every step
        return
    for tensor in held_tensors(obj):
        record_tensor(tensor, stream)


def held_tensors(obj: Any) -> list[torch.Tensor]:
    """Every distinct tensor reachable from `obj` (each once, cycles followed once)."""
    return list(_walk(obj, set()))


def _children(obj: Any) -> Iterator[Any]:
    """What `obj` holds directly."""
    if isinstance(obj, dict):
        yield from obj.keys()
        yield from obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from obj
    elif isinstance(obj, types.FunctionType):  # deferred work: its cells and defaults, not its globals
        yield from (cell.cell_contents for cell in obj.__closure__ or () if _filled(cell))
        yield obj.__defaults__
        yield obj.__kwdefaults__
    elif isinstance(obj, types.MethodType):
        yield obj.__self__
        yield obj.__func__
    elif isinstance(obj, functools.partial):  # deferred work: its arguments; its function is a
        yield obj.args                         # planner's method (long-lived state, held anyway)
        yield obj.keywords
    elif isinstance(obj, types.CellType):
        if _filled(obj):
            yield obj.cell_contents
    else:
        if hasattr(obj, "__dict__"):
            yield from vars(obj).values()
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if name != "__dict__" and hasattr(obj, name):
                    yield getattr(obj, name)
        if dataclasses.is_dataclass(obj) and not hasattr(obj, "__dict__"):
            yield from (getattr(obj, f.name) for f in dataclasses.fields(obj))


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet assigned (a closure defined before its variable)
        return False
    return True


def _walk(obj: Any, seen: set[int]) -> Iterator[torch.Tensor]:
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, _LEAVES) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            yield item
            continue
        stack.extend(_children(item))
