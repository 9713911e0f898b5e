"""The two-level all-to-all of a `TwoLevelPlan` (two_level.py) as an autograd pair.

Forward, in `_TwoLevelStart`: the owner gathers its node-unique rows and
launches the rail all-to-all (between nodes, the slow hop) asynchronously;
`wait()` (`_TwoLevelWait`) waits for it, picks each node rank's rows, runs the
intra-node all-to-all (the fast hop) and expands. Backward mirrors it: the
wait's backward segment-sums per unique bag, runs the intra-node hop back,
sums the node's gradients per node-unique bag and launches the rail hop
back; the start's backward waits for it and scatters the sums at each bag's
first occurrence for the fused embedding backward. So, as with TorchRec's
own dists, the transfer between nodes overlaps whatever runs between the
two halves.
Lossless only (no wire precision): the forwarder sums gradients, and a
rounded wire would round twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torchrec.distributed.types import Awaitable

from dlrmtrain.comm.dedup.kernels import expand_rows, gather_rows, segment_sum_rows
from dlrmtrain.comm.dedup.transport import DedupDistState, _start_all_to_all, _timed_wait, owner_gradient
from dlrmtrain.comm.dedup.two_level import TwoLevelPlan


@dataclass
class _Request:
    """One step's transfers, shared by the two halves."""

    plan: TwoLevelPlan
    owner: Any
    local_shape: torch.Size | None = None
    rail_send: torch.Tensor | None = None    # kept alive until its transfer is done
    rail_recv: torch.Tensor | None = None
    work: Any = None
    grad_rail_send: torch.Tensor | None = None
    grad_rail_recv: torch.Tensor | None = None
    grad_work: Any = None
    dummy: torch.Tensor = field(default_factory=lambda: torch.empty(1, requires_grad=True))


class _TwoLevelStart(torch.autograd.Function):
    """Forward: gather the node-unique rows, launch the rail hop. Backward: wait for it, scatter."""

    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, req: _Request) -> torch.Tensor:
        plan, owner = req.plan, req.owner
        t0 = time.perf_counter()
        req.rail_send = gather_rows(local_embs.reshape(-1, plan.unit), plan.rail_send_index).view(-1)
        req.rail_recv = req.rail_send.new_empty(sum(plan.rail_recv_splits))
        req.work = _start_all_to_all(req.rail_recv, req.rail_send, plan.rail_recv_splits, plan.rail_send_splits,
                                     plan.groups.rail)
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
        grad_local = owner_gradient(owner, req.grad_rail_recv, plan.rail_send_index, req.local_shape,
                                    plan.unit)
        req.grad_rail_send = req.grad_rail_recv = req.grad_work = None
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        ctx.req = None
        return grad_local, None


class _TwoLevelWait(torch.autograd.Function):
    """Forward: wait for the rail hop, forward inside the node, expand.
    Backward: segment-sum, the intra-node hop back, sum per node-unique bag, launch the rail hop back."""

    @staticmethod
    def forward(ctx, dummy: torch.Tensor, req: _Request) -> torch.Tensor:
        plan, owner = req.plan, req.owner
        _timed_wait(req.work, owner.comm_stats)
        t0 = time.perf_counter()
        intra_send = gather_rows(req.rail_recv.view(-1, plan.unit), plan.intra_send_index).view(-1)
        total = sum(plan.intra_recv_splits)
        intra_recv = intra_send.new_empty(total + plan.pad_units * plan.unit)
        intra_recv[total:].zero_()
        work = _start_all_to_all(intra_recv[:total], intra_send, plan.intra_recv_splits, plan.intra_send_splits,
                                 plan.groups.intra)
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        _timed_wait(work, owner.comm_stats)
        t0 = time.perf_counter()
        out = owner.output_pool.get((plan.recv_index.numel(), plan.unit), intra_recv.dtype, intra_recv.device)
        expand_rows(intra_recv.view(-1, plan.unit), plan.recv_index, out=out)
        req.rail_recv = req.rail_send = req.work = None
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
        grad_intra = grad_recv.new_empty(sum(plan.intra_send_splits))
        work = _start_all_to_all(grad_intra, grad_recv.reshape(-1), plan.intra_send_splits, plan.intra_recv_splits,
                                 plan.groups.intra)
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        _timed_wait(work, owner.comm_stats)
        t0 = time.perf_counter()
        # the forwarder: one gradient per node-unique bag, summed over its node's ranks
        rail_units = sum(plan.rail_recv_splits) // plan.unit
        req.grad_rail_send = segment_sum_rows(grad_intra.view(-1, plan.unit), plan.intra_send_index,
                                              rail_units).view(-1)
        req.grad_rail_recv = req.grad_rail_send.new_empty(sum(plan.rail_send_splits))
        req.grad_work = _start_all_to_all(req.grad_rail_recv, req.grad_rail_send, plan.rail_send_splits,
                                          plan.rail_recv_splits, plan.groups.rail)
        owner.comm_stats.codec_seconds += time.perf_counter() - t0
        ctx.req = None
        return torch.zeros_like(req.dummy), None


class TwoLevelAwaitable(Awaitable[torch.Tensor]):
    """The rail hop (between nodes) in flight; `wait()` forwards inside the node and expands."""

    def __init__(self, dummy: torch.Tensor, req: _Request) -> None:
        super().__init__()
        self._dummy, self._req = dummy, req

    def _wait_impl(self) -> torch.Tensor:
        return _TwoLevelWait.apply(self._dummy, self._req)


def start_two_level_all_to_all(local_embs: torch.Tensor, plan: TwoLevelPlan,
                               owner: DedupDistState) -> TwoLevelAwaitable:
    """Launch the rail hop of `plan`; wait() on the result runs the intra-node hop and expands."""
    req = _Request(plan, owner)
    return TwoLevelAwaitable(_TwoLevelStart.apply(local_embs, req), req)
