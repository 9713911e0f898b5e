"""The two-level all-to-all of a `TwoLevelPlan` (two_level.py) as an autograd pair.

Forward, in `_TwoLevelStart`: the owner gathers its node-unique rows and
sends them over its rail (between nodes; waited for), the forwarder picks
each node rank's rows and launches the intra-node all-to-all asynchronously;
`wait()` (`_TwoLevelWait`) waits for it and expands. Backward mirrors it:
the wait's backward segment-sums per unique bag and launches the reverse
intra-node all-to-all; the start's backward waits for it, sums the node's
gradients per node-unique bag, sends them back over the rail and scatters
them at each bag's first occurrence for the fused embedding backward.
Lossless only (no wire precision): the forwarder sums gradients, and a
rounded wire would round twice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torchrec.distributed import comm_ops
from torchrec.distributed.types import Awaitable

from dlrmtrain.comm.dedup.kernels import expand_rows, gather_rows, segment_sum_rows
from dlrmtrain.comm.dedup.transport import DedupDistState, _start_all_to_all, _timed_wait
from dlrmtrain.comm.dedup.two_level import TwoLevelPlan


@dataclass
class _Request:
    """One step's transfers, shared by the two halves."""

    plan: TwoLevelPlan
    owner: Any
    local_shape: torch.Size | None = None
    intra_send: torch.Tensor | None = None   # kept alive until its transfer is done
    intra_recv: torch.Tensor | None = None
    work: Any = None
    grad_intra_send: torch.Tensor | None = None
    grad_intra_recv: torch.Tensor | None = None
    grad_work: Any = None
    dummy: torch.Tensor = field(default_factory=lambda: torch.empty(1, requires_grad=True))


class _TwoLevelStart(torch.autograd.Function):
    """Forward: rail hop (owner -> forwarder), launch the intra-node hop. Backward: the mirror's end."""

    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, req: _Request) -> torch.Tensor:
        plan, owner = req.plan, req.owner
        t0 = time.perf_counter()
        send = gather_rows(local_embs.reshape(-1, plan.unit), plan.rail_send_index)
        rail_recv = send.new_empty(sum(plan.rail_recv_splits))
        work = _start_all_to_all(rail_recv, send.view(-1), plan.rail_recv_splits, plan.rail_send_splits,
                                 plan.groups.rail)
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        _timed_wait(work, owner.comm_stats)
        t0 = time.perf_counter()
        req.intra_send = gather_rows(rail_recv.view(-1, plan.unit), plan.intra_send_index).view(-1)
        total = sum(plan.intra_recv_splits)
        req.intra_recv = send.new_empty(total + plan.pad_units * plan.unit)
        req.intra_recv[total:].zero_()
        req.work = _start_all_to_all(req.intra_recv[:total], req.intra_send, plan.intra_recv_splits,
                                     plan.intra_send_splits, plan.groups.intra)
        req.local_shape = local_embs.shape
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        ctx.req = req
        return req.dummy

    @staticmethod
    def backward(ctx, _unused: torch.Tensor):
        req = ctx.req
        plan, owner = req.plan, req.owner
        _timed_wait(req.grad_work, owner.comm_stats)
        t0 = time.perf_counter()
        # the forwarder: one gradient per node-unique bag, summed over its node's ranks
        rail_units = sum(plan.rail_recv_splits) // plan.unit
        grad_rail = segment_sum_rows(req.grad_intra_send.view(-1, plan.unit), plan.intra_send_index, rail_units)
        grad_send = grad_rail.new_empty(sum(plan.rail_send_splits))
        work = _start_all_to_all(grad_send, grad_rail.view(-1), plan.rail_send_splits, plan.rail_recv_splits,
                                 plan.groups.rail)
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        _timed_wait(work, owner.comm_stats)
        t0 = time.perf_counter()
        if comm_ops.get_gradient_division():  # as TorchRec's all-to-all backward
            grad_send = grad_send / owner.world_size
        numel = math.prod(req.local_shape)
        grad_local = owner.grad_pool.scattered((numel // plan.unit, plan.unit), plan.rail_send_index,
                                               grad_send.view(-1, plan.unit))
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        ctx.req = None
        return grad_local.view(req.local_shape), None


class _TwoLevelWait(torch.autograd.Function):
    """Forward: wait for this rank's rows and expand them. Backward: segment-sum, launch the reverse hop."""

    @staticmethod
    def forward(ctx, dummy: torch.Tensor, req: _Request) -> torch.Tensor:
        plan, owner = req.plan, req.owner
        _timed_wait(req.work, owner.comm_stats)
        t0 = time.perf_counter()
        recv = req.intra_recv
        out = owner.output_pool.get((plan.recv_index.numel(), plan.unit), recv.dtype, recv.device)
        expand_rows(recv.view(-1, plan.unit), plan.recv_index, out=out)
        req.intra_recv = req.intra_send = req.work = None
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        ctx.req = req
        return out.view(plan.out_shape)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        req = ctx.req
        plan, owner = req.plan, req.owner
        t0 = time.perf_counter()
        units = sum(plan.intra_recv_splits) // plan.unit
        grad_recv = segment_sum_rows(grad_out.contiguous().view(-1, plan.unit), plan.recv_index,
                                     units + plan.pad_units)[:units]
        req.grad_intra_send = grad_recv.new_empty(sum(plan.intra_send_splits))
        req.grad_work = _start_all_to_all(req.grad_intra_send, grad_recv.view(-1), plan.intra_send_splits,
                                          plan.intra_recv_splits, plan.groups.intra)
        req.grad_intra_recv = grad_recv
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        ctx.req = None
        return torch.zeros_like(req.dummy), None


class TwoLevelAwaitable(Awaitable[torch.Tensor]):
    """The intra-node hop in flight; `wait()` returns the expanded pooled embeddings."""

    def __init__(self, dummy: torch.Tensor, req: _Request) -> None:
        super().__init__()
        self._dummy, self._req = dummy, req

    def _wait_impl(self) -> torch.Tensor:
        return _TwoLevelWait.apply(self._dummy, self._req)


def start_two_level_all_to_all(local_embs: torch.Tensor, plan: TwoLevelPlan,
                               owner: DedupDistState) -> TwoLevelAwaitable:
    """Run the rail hop of `plan` and launch its intra-node hop; wait() on the result expands."""
    req = _Request(plan, owner)
    return TwoLevelAwaitable(_TwoLevelStart.apply(local_embs, req), req)
