"""The one dedup output dist: every sharding type and both levels share it, a route differs.

The dist owns what every route shares: the constructor (process group, wire
precision, buffer pools, counters), the forward checks (both ends' ids
present, no variable batch per feature), the plan loop (time it, count the
step, or fall back to TorchRec's stock dist when the planner declines) and the
launch of the route's transport. The `Route` (plan.py), built by the codec,
pairs a planner that knows its sharding's wire layout (table_wise.py,
row_wise.py, sequence.py, two_level/) with the transport that carries
out its plans (transport.py, two_level/transport.py): given the step's
`DedupStep`, the planner deduplicates the ids of both ends, reads their counts
in the step's host sync, builds the plan and counts the step's bytes with
`TableCommStats.add_rows`; the dist counts every plan's messages and bytes
between and inside nodes (`Plan.traffic`).

A plan depends on the ids only. Under the pipeline (torchrec/pipelines.
`PlanAheadTrainPipelineSparseDist`) `plan_ahead` makes it as soon as the
batch's ids have arrived, during the previous step, and the forward only
carries it out: no unique, no sort and no host sync on the step's critical
path (`DistCommStats.step_host_syncs` counts those that remain: the route's
`plan_syncs` per plan made in a forward).
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.embedding_sharding import EmbeddingShardingContext
from torchrec.distributed.types import Awaitable

from dlrmtrain.comm import streams
from dlrmtrain.comm.codec import DistSpec
from dlrmtrain.comm.dedup.buffers import BufferPool
from dlrmtrain.comm.dedup.plan import DedupPlanner, DedupStep, Plan, PlannedAhead, Route
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.comm.torchrec.contexts import ids_of_both_ends, set_plan_ahead, set_started_with_ids, started_with_ids, take_plan_ahead
from dlrmtrain.comm.torchrec.sharded import dist_callbacks

logger = logging.getLogger(__name__)


class DedupDist(nn.Module):
    """Drop-in for TorchRec's output dist under `dedup` (and `dedup+fp16/bf16`), pooled or sequence."""

    def __init__(self, spec: DistSpec, route: Route, codec_name: str,
                 wire_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.stock_dist = spec.stock_dist  # the fallback
        self.route = route
        self.pg = spec.pg
        self.rank = spec.rank
        self.world_size = dist.get_world_size(spec.pg)
        self.wire_dtype = wire_dtype
        # column-wise sharding reorders shards with a callback; keep it (it is differentiable)
        self.output_callbacks = dist_callbacks(spec.stock_dist)
        self.output_pool = BufferPool()  # expanded outputs (forward)
        self.grad_pool = BufferPool()    # embedding gradients (backward)
        # the embeddings' element size, learned from the last forward: plans made ahead count bytes at it
        self.elem_bytes: int | None = None
        table_codecs = {t: codec_name if t in spec.tables else "none" for t in sorted(spec.all_tables())}
        self.comm_stats = DistCommStats(codec=codec_name, sharding_type=spec.sharding_type,
                                        lossy=wire_dtype is not None, table_codecs=table_codecs,
                                        hierarchy=route.hierarchy)

    @property
    def planner(self) -> DedupPlanner:
        return self.route.planner

    def forward(self, local_embs: torch.Tensor,
                sharding_ctx: EmbeddingShardingContext | None = None) -> Awaitable[torch.Tensor]:
        elem_bytes = local_embs.element_size()
        ahead = take_plan_ahead(sharding_ctx)
        if ahead is not None and ahead.elem_bytes == elem_bytes:
            plan = ahead.plan
            self.comm_stats.add(ahead.stats)
            self.comm_stats.planned_ahead += 1
            plan_seconds = ahead.seconds
            _use_on_current_stream(plan, local_embs.device)
        else:  # plan now, on the critical path
            t0 = time.perf_counter()
            extra_syncs = self.comm_stats.extra_syncs
            plan = self.planner.plan(self._step(sharding_ctx, elem_bytes, self.comm_stats))
            self.comm_stats.step_host_syncs += self.route.plan_syncs + self.comm_stats.extra_syncs - extra_syncs
            plan_seconds = time.perf_counter() - t0
        self.elem_bytes = elem_bytes
        if plan is None:
            if not self.comm_stats.fallback_steps:
                logger.warning(self.planner.fallback_warning)
            self.comm_stats.fallback_steps += 1
            return self.stock_dist(local_embs, sharding_ctx)
        self.comm_stats.codec_seconds += plan_seconds
        self.comm_stats.steps += 1
        topology = self.route.topology
        self.comm_stats.count_traffic(plan.traffic(topology), self.rank, topology.node_of,
                                      self._wire_bytes(elem_bytes))
        awaitable = self.route.start(local_embs, plan, self)
        awaitable.callbacks.extend(self.output_callbacks)
        return awaitable

    def plan_ahead(self, sharding_ctx: EmbeddingShardingContext) -> None:
        """Plan the pass that will get `sharding_ctx` now that both ends' ids are in it
        (`hooks.PlansAhead`); the plan waits in the context, its bytes in its own counters.

        Before this dist's first forward the embeddings' element size is not known:
        that pass plans for itself.
        """
        if self.elem_bytes is None:
            return
        stats = DistCommStats(codec=self.comm_stats.codec, sharding_type=self.comm_stats.sharding_type)
        t0 = time.perf_counter()
        plan = self.planner.plan(self._step(sharding_ctx, self.elem_bytes, stats))
        set_plan_ahead(sharding_ctx, PlannedAhead(plan, self.elem_bytes, stats, time.perf_counter() - t0))

    def _step(self, sharding_ctx: EmbeddingShardingContext | None, elem_bytes: int,
              stats: DistCommStats) -> DedupStep:
        """The planner's input: both ends' ids from `sharding_ctx`, counted into `stats`."""
        owner_kjt, sample_kjt = ids_of_both_ends(sharding_ctx)
        if owner_kjt is None or sample_kjt is None:
            raise RuntimeError(
                "dedup output dist needs the ids of both ends; it is driven by "
                "IdRecordingShardedEBC.compute[_and_output_dist] before output_dist")
        if sharding_ctx.variable_batch_per_feature:
            raise NotImplementedError("dedup codec: variable batch size per feature is not supported")
        sizes = list(sharding_ctx.batch_size_per_rank) or [sample_kjt.stride()] * self.world_size
        return DedupStep(owner_kjt, sample_kjt, sizes, self.rank, owner_kjt.values().device, elem_bytes,
                         self._wire_bytes(elem_bytes), stats, started_with_ids(sharding_ctx))

    def start_with_ids(self, sharding_ctx: EmbeddingShardingContext) -> None:
        """`hooks.StartsWithIds`: a planner that needs something launched when the ids leave (row-wise:
        the flags every rank must agree on) starts it here, never inside its plan."""
        start = getattr(self.planner, "start_with_ids", None)
        if start is not None:
            set_started_with_ids(sharding_ctx, start(ids_of_both_ends(sharding_ctx)[1]))

    def _wire_bytes(self, elem_bytes: int) -> int:
        return torch.empty(0, dtype=self.wire_dtype).element_size() if self.wire_dtype else elem_bytes

    def counted_bytes(self) -> DistCommStats:
        """This dist's counters (`stats.CountsCommBytes`)."""
        return self.comm_stats


def _use_on_current_stream(plan: Plan | None, device: torch.device) -> None:
    """A plan made ahead on the pipeline's data-dist stream is used on the current one: keep the
    caching allocator from reusing its memory (every tensor it holds, `Multistreamable`) before
    this stream is done with it."""
    if plan is not None:
        plan.record_stream(streams.current_stream(device))
