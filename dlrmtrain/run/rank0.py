"""What rank 0 decides for every rank at a run's start (whose run directory this is,
whether a resume may go on): its result on every rank, or the same error on every rank."""

from __future__ import annotations

from typing import Any, Callable

import torch.distributed as dist


def decide_on_rank0(decide: Callable[[], Any], rank: int) -> Any:
    """Run `decide` on rank 0 and hand its result to every rank; if it raises,
    every rank raises the same exception type and message (so none is left
    waiting for a rank that gave up)."""
    outcome: list[Any] = [None, None]  # result, (exception type, message)
    if rank == 0:
        try:
            outcome[0] = decide()
        except Exception as e:  # re-raised below, on every rank
            outcome[1] = (type(e), str(e))
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        error_type, message = outcome[1]
        try:
            error = error_type(message)
        except TypeError:  # a type that needs more than a message
            error = RuntimeError(f"{error_type.__name__} on rank 0: {message}")
        raise error
    return outcome[0]
