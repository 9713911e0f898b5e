"""The two-level all-to-all of a `TwoLevelPlan` (shared.py) as an autograd pair.

Forward, in `_TwoLevelStart`: the owner gathers the rows it sends and
launches stage 1 asynchronously: the rail all-to-all (between nodes, the slow
hop) first, then the rows for its own node's ranks (inside the node).
`wait()` (`_TwoLevelWait`) plans stage 2 while they travel (`TwoLevelPlan.complete`),
waits for the rail hop, forwards inside the node what each rank uses (stage 2),
waits for both and expands. Backward mirrors it: the wait's backward
segment-sums per unique bag, sends stage 2's sums to their forwarders (and
stage 1's straight to their owners, in flight until the end) and goes on
with the backward; when the node's sums are in, the forwarder sums them per
node-unique bag and launches the rail hop back (a callback on the intra-node
transfer, over the dist's own rail group `NodeGroups.rail_grad`); the
start's backward waits for both and scatters the sums at each bag's first
occurrence for the fused embedding backward. So, as with TorchRec's own
dists, the transfer between nodes overlaps whatever runs between the two
halves. Every phase's time goes to the dist's `hop_seconds` (`comm.stats.HOPS`).
Lossless only (no wire precision): the forwarder sums gradients, and a
rounded wire would round twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dlrmtrain.comm import timing
from dlrmtrain.comm.dedup.kernels import gather_rows, segment_sum_rows
from dlrmtrain.comm.dedup.plan import DedupPlanner, Route
from dlrmtrain.comm.dedup.transport import (
    DedupAwaitable,
    DedupDistState,
    _start_all_to_all,
    autograd_dummy,
    count_codec,
    expand_output,
    gradient_sums,
    keep_for_backward,
    owner_gradient,
    taken_here,
    timed_wait,
)
from dlrmtrain.comm.dedup.two_level.shared import TwoLevelPlan
from dlrmtrain.comm.topology import Hierarchy, NodeTopology


TWO_LEVEL_PLAN_SYNCS = 2
"""host syncs of one two-level plan: the unique counts and the node's id exchange"""


@dataclass
class _Request:
    """One step's transfers, shared by the two halves."""

    plan: TwoLevelPlan
    owner: Any
    local_shape: torch.Size | None = None
    send: torch.Tensor | None = None        # kept alive until its transfers are done
    rail_recv: torch.Tensor | None = None
    recv: torch.Tensor | None = None        # [stage 1 local | stage 2 | pad]: what the expand reads
    work: Any = None
    local_work: Any = None
    grad_owner: torch.Tensor | None = None  # [stage 1 local | rail]: the owner's received sums
    grad_sends: tuple = ()                  # kept alive until their transfers are done
    grad_rail: Any = None                   # future of `sum_and_send`, which launches the rail hop back
    grad_rail_work: Any = None              # that launch
    node_sum_seconds: timing.Elapsed = 0.0
    grad_local_work: Any = None
    dummy: torch.Tensor | None = None       # on the data's device (`transport.autograd_dummy`)


class _TwoLevelStart(torch.autograd.Function):
    """Forward: gather the owner's rows, launch stage 1. Backward: wait for the sums, scatter."""

    @staticmethod
    def forward(ctx, local_embs: torch.Tensor, req: _Request) -> torch.Tensor:
        plan = req.plan
        t0 = timing.stamp(local_embs.device)
        send = gather_rows(local_embs.reshape(-1, plan.unit), plan.send_index).view(-1)
        local = plan.local_elems
        req.rail_recv = send.new_empty(sum(plan.rail_recv_splits))
        req.work = _start_all_to_all(req.rail_recv, send[local:], plan.rail_recv_splits, plan.rail_send_splits,
                                     plan.groups.rail)  # the slow hop first
        stage1, stage2 = plan.local_recv_elems, sum(plan.intra_recv_splits)
        req.recv = send.new_empty(stage1 + stage2 + plan.pad_units * plan.unit)
        req.recv[stage1 + stage2:].zero_()
        if plan.local_send_splits is not None:
            req.local_work = _start_all_to_all(req.recv[:stage1], send[:local], plan.local_recv_splits,
                                               plan.local_send_splits, plan.groups.intra)
        req.send, req.local_shape = send, local_embs.shape
        return keep_for_backward(ctx, req, t0, local_embs.device, req.dummy, "gather")

    @staticmethod
    def backward(ctx, _unused: torch.Tensor):
        req = taken_here(ctx)
        device, stats = req.dummy.device, req.owner.comm_stats
        t0 = timing.stamp(device)
        req.grad_rail.wait()  # the node's gradients summed and their rail hop launched
        grad_work = req.grad_rail_work
        t1 = timing.stamp(device)
        stats.add_time("transfer", timing.elapsed(t0, t1, (req.node_sum_seconds,)), "intra bwd")
        stats.add_time("codec", req.node_sum_seconds, "node sum")  # off this thread, but codec all the same
        t0 = timed_wait(grad_work, stats, device, "rail bwd")
        if req.grad_local_work is not None:
            t0 = timed_wait(req.grad_local_work, stats, device, "intra bwd")
        grad_local = owner_gradient(req, req.grad_owner)
        req.grad_owner = req.grad_rail = req.grad_rail_work = req.grad_local_work = None
        req.grad_sends = ()
        count_codec(stats, t0, device, "scatter")
        return grad_local, None


class _TwoLevelWait(torch.autograd.Function):
    """Forward: wait for the rail hop, forward inside the node (stage 2), expand.
    Backward: segment-sum, stage 2 back, sum per node-unique bag, launch the rail hop back."""

    @staticmethod
    def forward(ctx, dummy: torch.Tensor, req: _Request) -> torch.Tensor:
        plan, owner = req.plan, req.owner
        # stage 2's plan while stage 1 travels: here rather than at launch, so that whatever runs
        # between the halves (the bottom MLP) runs first and the node's ranks meet later in the id
        # exchange (its hops: "ids", "plan")
        device = dummy.device
        t0 = timing.stamp(device)
        plan.complete()
        count_codec(owner.comm_stats, t0, device)
        t0 = timed_wait(req.work, owner.comm_stats, device, "rail fwd")
        stage1, stage2 = plan.local_recv_elems, sum(plan.intra_recv_splits)
        intra_send = gather_rows(req.rail_recv.view(-1, plan.unit), plan.intra_send_index).view(-1)
        work = _start_all_to_all(req.recv[stage1:stage1 + stage2], intra_send, plan.intra_recv_splits,
                                 plan.intra_send_splits, plan.groups.intra)
        count_codec(owner.comm_stats, t0, device, "intra fwd")
        t0 = timed_wait(work, owner.comm_stats, device, "intra fwd")
        if req.local_work is not None:
            t0 = timed_wait(req.local_work, owner.comm_stats, device, "intra fwd")
        out = expand_output(owner, req.recv, plan)
        req.rail_recv = req.send = req.recv = req.work = req.local_work = None
        return keep_for_backward(ctx, req, t0, device, out, "expand")

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        device = grad_out.device
        t0 = timing.stamp(device)
        req = ctx.req
        plan, owner = req.plan, req.owner
        stage1, stage2 = plan.local_recv_elems, sum(plan.intra_recv_splits)
        grad_recv = gradient_sums(grad_out, plan, (stage1 + stage2) // plan.unit).reshape(-1)
        # stage 2 back to the forwarders first (the rail hop waits for it), stage 1 straight to the owners
        grad_intra = grad_recv.new_empty(sum(plan.intra_send_splits))
        work = _start_all_to_all(grad_intra, grad_recv[stage1:], plan.intra_send_splits, plan.intra_recv_splits,
                                 plan.groups.intra)
        local = plan.local_elems
        req.grad_owner = grad_recv.new_empty(local + sum(plan.rail_send_splits))
        if plan.local_send_splits is not None:
            req.grad_local_work = _start_all_to_all(req.grad_owner[:local], grad_recv[:stage1],
                                                    plan.local_send_splits, plan.local_recv_splits,
                                                    plan.groups.intra)
        count_codec(owner.comm_stats, t0, device, "intra bwd")
        rail_units = sum(plan.rail_recv_splits) // plan.unit

        def sum_and_send(_stage2_done) -> None:
            # on the intra-node group's thread once the node's stage 2 gradients are in: the
            # forwarder's one gradient per node-unique bag, summed over its node's ranks, launched
            # over the rail. This thread goes on with the backward meanwhile (the bottom MLP's),
            # so a rank whose node peer is slower waits for it off the critical path.
            t = timing.stamp(device)
            grad_rail = segment_sum_rows(grad_intra.view(-1, plan.unit), plan.intra_send_index,
                                         rail_units).view(-1)
            req.grad_sends = (grad_recv, grad_intra, grad_rail)
            # kept in the request, not returned: a CUDA future extracts the tensors of a
            # callback's value (torch._jit_internal._extract_tensors), which a Work cannot give
            req.grad_rail_work = _start_all_to_all(req.grad_owner[local:], grad_rail, plan.rail_send_splits,
                                                   plan.rail_recv_splits, plan.groups.rail_grad)
            req.node_sum_seconds = timing.since(t, device)[0]

        req.grad_sends = (grad_recv, grad_intra)
        req.grad_rail = work.get_future().then(sum_and_send)
        ctx.req = None
        return torch.zeros_like(req.dummy), None


class TwoLevelAwaitable(DedupAwaitable):
    """The rail hop (between nodes) in flight; `wait()` forwards inside the node and expands."""

    wait_half = _TwoLevelWait


def start_two_level_all_to_all(local_embs: torch.Tensor, plan: TwoLevelPlan,
                               owner: DedupDistState) -> TwoLevelAwaitable:
    """Launch the rail hop of `plan`; wait() on the result runs the intra-node hop and expands."""
    req = _Request(plan, owner, dummy=autograd_dummy(local_embs.device))
    return TwoLevelAwaitable(_TwoLevelStart.apply(local_embs, req), req)


def two_level_route(planner: DedupPlanner, topology: NodeTopology, hierarchy: Hierarchy) -> Route:
    """Two levels: `planner`'s `TwoLevelPlan`s carried out by `start_two_level_all_to_all`."""
    return Route(planner, start_two_level_all_to_all, topology, hierarchy, TWO_LEVEL_PLAN_SYNCS)
