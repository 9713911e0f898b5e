"""The dedup all-to-all as TorchRec-style asynchronous autograd functions.

`start_dedup_all_to_all` launches the forward all-to-all of the unique rows
(`async_op=True`) and returns an `Awaitable`; its `wait()` waits for the
transfer and expands the rows. Backward mirrors it: the wait's backward
segment-sums the gradient and launches the reverse all-to-all, the start's
backward waits for it and scatters the sums for the embedding backward. So,
like TorchRec's own dists, the transfer overlaps whatever runs between the
two halves (under `TrainPipelineSparseDist`, the dense forward/backward of
another batch on GPUs). Nothing here reads a device value on the host: the
split sizes come from the plan, built with the one host sync per step.

Optionally the rows travel at a lower, LOSSY precision (`dedup+fp16`,
`dedup+bf16`), rounded by the same fbgemm casts TorchRec's qcomms use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from fbgemm_gpu.quantize_utils import (
    bf16_to_fp32,
    fp16_to_fp32,
    fp32_to_bf16_with_clamp,
    fp32_to_fp16_with_clamp,
)
from torchrec.distributed import comm_ops
from torchrec.distributed.types import Awaitable

from dlrmtrain.comm import streams, timing
from dlrmtrain.comm.dedup.buffers import BufferPool
from dlrmtrain.comm.dedup.kernels import expand_rows, gather_rows, segment_sum_rows
from dlrmtrain.comm.dedup.plan import DedupPlan, DedupPlanner, Route
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.comm.topology import NodeTopology


class DedupDistState(Protocol):
    """What the autograd functions need from the dist that owns them."""

    pg: dist.ProcessGroup
    world_size: int
    wire_dtype: torch.dtype | None
    comm_stats: DistCommStats
    output_pool: BufferPool
    grad_pool: BufferPool


@dataclass
class _Request:
    """One step's transfers in flight, shared by the two halves."""

    plan: DedupPlan
    owner: Any
    local_shape: torch.Size | None = None
    dtype: torch.dtype | None = None
    send: torch.Tensor | None = None       # kept alive until its transfer is done
    recv: torch.Tensor | None = None
    work: Any = None
    grad_recv: torch.Tensor | None = None  # kept alive until its transfer is done
    grad_send: torch.Tensor | None = None
    grad_work: Any = None
    dummy: torch.Tensor | None = None      # links the two halves in autograd (`autograd_dummy`)


def autograd_dummy(device: torch.device) -> torch.Tensor:
    """The tensor the start hands the wait so autograd runs their backwards in mirror order; on the
    data's device, as TorchRec's `comm_ops.Request` makes its own (a CPU one would put the backward's
    zeros_like and its autograd node on the host)."""
    return torch.empty(1, device=device, requires_grad=True)


def read_here(req: Any) -> None:
    """Record everything `req` holds (buffers, plan) on the current stream before a half reads it: the
    halves may run on different streams (TorchRec's fused pipeline starts the all-to-all on its lookup
    stream and waits on the default one; a backward runs on its forward's stream), and the caching
    allocator would recycle a buffer the other stream made as soon as the request drops it."""
    streams.record_stream(req, streams.current_stream(req.dummy.device))


def taken_here(ctx: Any) -> Any:
    """The request a start half's backward finishes: taken off `ctx` (the graph keeps it no longer)
    and recorded on this stream (`read_here`)."""
    req, ctx.req = ctx.req, None
    read_here(req)
    return req


def awaited(out: torch.Tensor) -> torch.Tensor:
    """What a wait hands back, recorded on the caller's stream as TorchRec's `comm_ops.Request` does."""
    streams.record_tensor(out, streams.current_stream(out.device))
    return out


_ENCODE = {torch.float16: fp32_to_fp16_with_clamp, torch.bfloat16: fp32_to_bf16_with_clamp}
_DECODE = {torch.float16: fp16_to_fp32, torch.bfloat16: bf16_to_fp32}


def _encode(rows: torch.Tensor, wire_dtype: torch.dtype | None) -> torch.Tensor:
    """Round rows to the lossy wire precision (fbgemm's clamped cast, as TorchRec's qcomms)."""
    if wire_dtype is None or rows.dtype == wire_dtype:
        return rows
    return _ENCODE[wire_dtype](rows.float())


def _decode(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if rows.dtype == dtype:
        return rows
    return _DECODE[rows.dtype](rows).to(dtype) if rows.dtype in _DECODE else rows.to(dtype)


def _start_all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
                      pg: dist.ProcessGroup):
    """Asynchronous all_to_all_single on flat tensors; 16-bit payloads travel as bytes (gloo lacks them)."""
    if inp.element_size() == 2:
        out, inp = out.view(torch.uint8), inp.view(torch.uint8)
        out_splits, in_splits = [2 * s for s in out_splits], [2 * s for s in in_splits]
    return dist.all_to_all_single(out, inp, out_splits, in_splits, group=pg, async_op=True)


def timed_wait(work, stats: DistCommStats, device: torch.device, hop: str | None = None) -> timing.Stamp:
    """Wait for a transfer, counted as transfer time (and of `hop`, two levels); returns now.
    On CUDA `wait()` only holds the current stream, so the time is the stream's (`comm.timing`)."""
    t0 = timing.stamp(device)
    work.wait()
    seconds, t1 = timing.since(t0, device)
    stats.add_time("transfer", seconds, hop)
    return t1


def count_codec(stats: DistCommStats, t0: timing.Stamp, device: torch.device, hop: str | None = None
                ) -> timing.Stamp:
    """Count the time since `t0` on `device` as codec time (and of `hop`, two levels); returns now."""
    seconds, t1 = timing.since(t0, device)
    stats.add_time("codec", seconds, hop)
    return t1


def keep_for_backward(ctx: Any, req: Any, t0: timing.Stamp, device: torch.device, out: torch.Tensor,
                      hop: str | None = None) -> torch.Tensor:
    """A forward half's end: the time since `t0` counted as codec time (of `hop`, two levels),
    `req` kept on `ctx` for the backward half, `out` returned."""
    count_codec(req.owner.comm_stats, t0, device, hop)
    ctx.req = req
    return out


def owner_gradient(req: Any, grad_rows: torch.Tensor) -> torch.Tensor:
    """The gradient of the owner's local embeddings (`req.local_shape`): each received row sum where
    its row was sent from (`plan.send_index`), zeros elsewhere (for the fused embedding backward),
    divided by the world size as TorchRec's all-to-all backward does."""
    owner, unit, local_shape = req.owner, req.plan.unit, req.local_shape
    if comm_ops.get_gradient_division():
        grad_rows = grad_rows / owner.world_size
    numel = math.prod(local_shape)
    grad = owner.grad_pool.scattered((numel // unit, unit), req.plan.send_index, grad_rows.view(-1, unit))
    return grad.view(local_shape)


def expand_output(owner: DedupDistState, recv: torch.Tensor, plan: Any) -> torch.Tensor:
    """Every output row read from the receive buffer at `plan.recv_index`, into a reused buffer."""
    out = owner.output_pool.get((plan.recv_index.numel(), plan.unit), recv.dtype, recv.device)
    expand_rows(recv.view(-1, plan.unit), plan.recv_index, out=out)
    return out.view(plan.out_shape)


def gradient_sums(grad_out: torch.Tensor, plan: Any, received_units: int) -> torch.Tensor:
    """The expand's backward: the output gradient summed per received unit row (pad rows dropped)."""
    return segment_sum_rows(grad_out.contiguous().view(-1, plan.unit), plan.recv_index,
                            received_units + plan.pad_units, plan.recv_segments)[:received_units]


class _DedupStart(torch.autograd.Function):
    """Forward: pick (and round) the unique rows, launch the all-to-all. Backward: the mirror's end."""

    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, req: _Request) -> torch.Tensor:
        plan, owner = req.plan, req.owner
        t0 = timing.stamp(local_embs.device)
        send = _encode(gather_rows(local_embs.reshape(-1, plan.unit), plan.send_index), owner.wire_dtype)
        total = sum(plan.recv_splits)
        req.recv = send.new_empty(total + plan.pad_units * plan.unit)
        req.recv[total:].zero_()
        req.work = _start_all_to_all(req.recv[:total], send.view(-1), plan.recv_splits, plan.send_splits,
                                     owner.pg)
        req.send = send
        req.local_shape, req.dtype = local_embs.shape, local_embs.dtype
        return keep_for_backward(ctx, req, t0, local_embs.device, req.dummy)

    @staticmethod
    def backward(ctx, _unused: torch.Tensor):
        req = taken_here(ctx)
        stats, device = req.owner.comm_stats, req.dummy.device
        t0 = timed_wait(req.grad_work, stats, device)
        grad_local = owner_gradient(req, _decode(req.grad_send, req.dtype))
        count_codec(stats, t0, device)
        return grad_local, None


class _DedupWait(torch.autograd.Function):
    """Forward: wait for the rows and expand them. Backward: segment-sum, launch the reverse all-to-all."""

    @staticmethod
    def forward(ctx, dummy: torch.Tensor, req: _Request) -> torch.Tensor:
        plan, owner = req.plan, req.owner
        t0 = timed_wait(req.work, owner.comm_stats, dummy.device)
        recv = _decode(req.recv, req.dtype)  # only the U unique rows: decode before expanding
        out = expand_output(owner, recv, plan)
        req.recv = req.send = req.work = None
        return keep_for_backward(ctx, req, t0, dummy.device, out)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        t0 = timing.stamp(grad_out.device)
        req = ctx.req
        plan, owner = req.plan, req.owner
        grad_recv = _encode(gradient_sums(grad_out, plan, sum(plan.recv_splits) // plan.unit), owner.wire_dtype)
        req.grad_send = grad_recv.new_empty(sum(plan.send_splits))
        req.grad_work = _start_all_to_all(req.grad_send, grad_recv.reshape(-1), plan.send_splits,
                                          plan.recv_splits, owner.pg)
        req.grad_recv = grad_recv
        count_codec(owner.comm_stats, t0, grad_out.device)
        ctx.req = None
        return torch.zeros_like(req.dummy), None


class DedupAwaitable(Awaitable[torch.Tensor]):
    """The forward all-to-all in flight; `wait()` runs the transport's wait half (`wait_half`) and
    returns the expanded embeddings. Every dedup transport's awaitable is one of these."""

    wait_half: type[torch.autograd.Function] = _DedupWait

    def __init__(self, dummy: torch.Tensor, req: Any) -> None:
        super().__init__()
        self._dummy, self._req = dummy, req

    def _wait_impl(self) -> torch.Tensor:
        read_here(self._req)
        return awaited(self.wait_half.apply(self._dummy, self._req))


def start_dedup_all_to_all(local_embs: torch.Tensor, plan: DedupPlan, owner: DedupDistState) -> DedupAwaitable:
    """Launch the unique-row all-to-all of `plan`; wait() on the result decodes it."""
    req = new_request(local_embs, plan, owner)
    return DedupAwaitable(_DedupStart.apply(local_embs, req), req)


def new_request(local_embs: torch.Tensor, plan: DedupPlan, owner: DedupDistState) -> _Request:
    """The request of one pass over `local_embs`, its autograd dummy on their device."""
    return _Request(plan, owner, dummy=autograd_dummy(local_embs.device))


def flat_route(planner: DedupPlanner, topology: NodeTopology) -> Route:
    """One all-to-all over all ranks: `planner`'s `DedupPlan`s carried out by `start_dedup_all_to_all`."""
    return Route(planner, start_dedup_all_to_all, topology)
