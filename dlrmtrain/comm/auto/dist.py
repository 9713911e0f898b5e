"""`auto`'s output dist: per all-to-all (and per table) `none` or `dedup`, whichever measures faster.

`AutoDist` (built by `AutoCodec`, codec.py) holds TorchRec's stock dist and a `DedupDist` for the same tables
and sends each training step through one of them, as `AutoPolicy`
(policy.py) says: both alternate while it probes, then the faster
one stays. Every choice is agreed over ranks with one small all-reduce, so
both ends of every block always use the same path. Evaluation batches use the
current choice (`none` while probing) and are not timed. Lossless either way:
both paths give bitwise the same forward.

Settled: once the whole all-to-all is decided `none`, auto gets out of the
way. `AutoDist.forward` is shadowed by the stock dist's own call, so each
step runs TorchRec's dist as under `codec: none`; a forward pre-hook only
tallies the step (its bytes are counted in bulk when the counters are read)
and counts down to the next drift check. There auto steps back in for the
`drift_samples` timed steps that check needs (policy.py, `untimed_steps`),
checks, and settles again unless something drifted.

Planned ahead: under the pipeline (torchrec/pipelines.`PlanAheadPipeline`) `plan_ahead`
has dedup's dist plan the next training pass while this step runs, as under
`codec: dedup`, whenever that pass may take dedup (`AutoPolicy.next_paths`: the
next path is known except at a step that may decide). Settled on dedup, a
pipelined step makes no codec host sync; a plan whose pass takes none after all
(or whose tables a decision changed) is dropped in `forward`, its counters never
added.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.embedding_sharding import EmbeddingShardingContext
from torchrec.distributed.types import Awaitable

from dlrmtrain.comm import timing
from dlrmtrain.comm.auto.policy import AutoPolicy, Wire, link_bytes_per_s
from dlrmtrain.comm.codec import DistSpec
from dlrmtrain.comm.stats import DistCommStats, TableCommStats
from dlrmtrain.comm.stock_bytes import add_tallied_passes, count_stock_step, pass_key
from dlrmtrain.comm.torchrec.contexts import take_plan_ahead

logger = logging.getLogger(__name__)


class AutoDist(nn.Module):
    """Drop-in output dist that routes each step through the stock dist or dedup's."""

    def __init__(self, spec: DistSpec, dedup_dist: nn.Module, policy: AutoPolicy) -> None:
        super().__init__()
        self.stock_dist = spec.stock_dist
        self.dedup_dist = dedup_dist
        self.layout = spec.layout
        self.tables = set(spec.tables)
        self.pg = spec.pg
        self.rank = spec.rank
        self.sharding_type = spec.sharding_type
        self.policy = policy
        self.table_choice = {t: "dedup" for t in sorted(self.tables)}
        self.none_stats = DistCommStats(codec="none", sharding_type=spec.sharding_type)
        self._step_started: timing.Stamp | None = None  # when the running training step began
        self._untimed = False                    # something else ran inside the current period
        self._probe_base: dict[str, TableCommStats] | None = None  # dedup's counters when the probe began
        # settled on none (see the module's docstring)
        self._settled_hook = None
        self._settled_left = 0       # training steps the stock dist still runs alone
        self._untimed_periods = 0    # training steps that ran settled, for the policy's step count
        self._settled_counts: dict[tuple, int] = {}  # (batch sizes, rows, element size) → passes
        self._say(f"comm auto ({self._what()}): timing none and dedup steps in turn over the first "
                  f"{policy.warmup_steps + 2 * policy.min_probe_steps}-"
                  f"{policy.warmup_steps + 2 * policy.probe_steps} training steps; dedup "
                  f"is used only if its step is > {policy.margin:.0%} faster")

    # ------------------------------------------------------------- forward
    def forward(self, local_embs: torch.Tensor,
                sharding_ctx: EmbeddingShardingContext | None = None) -> Awaitable[torch.Tensor]:
        training = torch.is_grad_enabled() and local_embs.requires_grad
        if not training:
            self._untimed = True
            path = self.policy.choice if self.policy.phase == "steady" else "none"
            return self._run(path, local_embs, sharding_ctx)
        if self._untimed_periods:  # back from a settled run: count its steps
            self.policy.advance(self._untimed_periods)
            self._untimed_periods = 0
        # the period since the last training pass, on the device's clock (`comm.timing`: on CUDA
        # events, read only when the policy agrees its samples, a host sync anyway)
        now = timing.stamp(local_embs.device)
        if self._step_started is not None:
            if self._untimed:
                self.policy.skip()
            else:
                self.policy.observe(timing.elapsed(self._step_started, now))
        self._step_started, self._untimed = now, False
        tables = self._dedup_tables()  # what a plan made ahead for this pass deduplicates
        if self.policy.phase == "probe" and self._probe_base is None:
            self._probe_base = self._dedup_tables_snapshot()
            self._set_dedup_tables(self.tables)
        if self.policy.needs_decision() or (
                self.policy.early_check_due() and self.policy.clear_cut(
                    self._agree(self.policy.local_extremes(), local_embs.device, op=dist.ReduceOp.MAX))):
            self._decide(local_embs.device)
        elif self.policy.retime_due():
            self.policy.reprobe()
            self._note(self.policy.retime_line())
        elif self.policy.check_due():
            self._check_drift(local_embs.device)
        path = self.policy.path()
        if path != "dedup" or self._dedup_tables() != tables:
            # made ahead for a pass that takes none, or for other tables: dropped with its
            # counters (a plan's are added only when its pass runs)
            take_plan_ahead(sharding_ctx)
        awaitable = self._run(path, local_embs, sharding_ctx)
        untimed = self.policy.untimed_steps() if self.policy.choice == "none" else 0
        if untimed >= 2:  # this step and at least one more need no auto
            self._settle(untimed)
        return awaitable

    def start_with_ids(self, sharding_ctx) -> None:
        """`hooks.StartsWithIds`: what dedup launches with the ids (row-wise: its flags), whichever
        path the step then takes, so every rank launches the same collectives."""
        self.dedup_dist.start_with_ids(sharding_ctx)

    def plan_ahead(self, sharding_ctx) -> None:
        """`hooks.PlansAhead`: dedup's plan for the next training pass, made now (under the
        pipeline, while this step runs) wherever that pass may take dedup; `forward` drops it
        when the pass takes none after all (a decision at that step)."""
        if self.settled:
            return  # the stock dist runs the next pass, auto out of the way
        timed = None if self._step_started is None else not self._untimed  # as forward will count
        if "dedup" in self.policy.next_paths(self._untimed_periods, timed):
            self.dedup_dist.plan_ahead(sharding_ctx)

    def _run(self, path: str, local_embs: torch.Tensor, sharding_ctx) -> Awaitable[torch.Tensor]:
        if path == "dedup":
            return self.dedup_dist(local_embs, sharding_ctx)
        W = self.layout.world_size
        sizes = list(getattr(sharding_ctx, "batch_size_per_rank", None) or [])
        if not sizes:  # TorchRec leaves it empty when every rank has the same batch
            sizes = [local_embs.shape[0] // W] * W
        count_stock_step(self.none_stats, self.layout, self.rank, sizes, local_embs.element_size())
        return self.stock_dist(local_embs, sharding_ctx)

    # ------------------------------------------------------------- settled
    def _settle(self, untimed: int) -> None:
        """Hand the next `untimed - 1` training steps straight to the stock dist."""
        self._settled_left = untimed - 1
        self._untimed_periods = 1  # the current step's period is not timed either
        self._step_started = None
        # an instance attribute shadows AutoDist.forward: nn.Module.__call__ runs the stock dist
        self.forward = self.stock_dist.__call__
        self._settled_hook = self.register_forward_pre_hook(self._settled_step, with_kwargs=True)

    def _settled_step(self, _module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The settled path's only per-step Python: tally the pass, count down to the next check."""
        local_embs = args[0] if args else kwargs["local_embs"]
        ctx = args[1] if len(args) > 1 else kwargs.get("sharding_ctx")
        self._tally_settled(local_embs, ctx)
        if torch.is_grad_enabled() and local_embs.requires_grad:
            self._untimed_periods += 1
            self._settled_left -= 1
            if self._settled_left <= 0:
                self._unsettle()

    def _unsettle(self) -> None:
        """The next call enters `forward` again (this one is already on its way to the stock dist)."""
        del self.forward
        self._settled_hook.remove()
        self._settled_hook = None

    @property
    def settled(self) -> bool:
        """Whether the stock dist runs each step with auto out of the way."""
        return self._settled_hook is not None

    def _tally_settled(self, local_embs: torch.Tensor, sharding_ctx) -> None:
        key = pass_key(local_embs, sharding_ctx)
        self._settled_counts[key] = self._settled_counts.get(key, 0) + 1

    def _counted_steps(self) -> tuple[int, int]:
        """The policy's (steps after the probe, on dedup), with the settled steps it has not
        been told of yet (they took none)."""
        steps, dedup = self.policy.counted_steps()
        return steps + (self._untimed_periods if self.policy.decisions else 0), dedup

    def _flush_settled(self) -> None:
        """Add the tallied settled passes to none's counters (one counted pass times its tally)."""
        add_tallied_passes(self.none_stats, self.layout, self.rank, self._settled_counts)
        self._settled_counts = {}

    # ------------------------------------------------------------ decisions
    def _agree(self, values: list[float], device: torch.device, op=dist.ReduceOp.SUM) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op, group=self.pg)
        return t.tolist()

    def _decide(self, device: torch.device) -> None:
        W = self.layout.world_size
        names = sorted(self.tables)
        now = self._dedup_tables_snapshot()
        counts, wire = [], [0.0, 0.0]  # dedup's probe steps' bytes as sent, and as none would send
        for t in names:
            base = (self._probe_base or {}).get(t, TableCommStats())
            cur = now.get(t, TableCommStats())
            counts += [cur.bags - base.bags, cur.unique_bags - base.unique_bags]
            wire[0] += 2 * (cur.uncompressed_fwd_sent_bytes - base.uncompressed_fwd_sent_bytes)
            wire[1] += (cur.payload_fwd_sent_bytes - base.payload_fwd_sent_bytes
                        + cur.payload_bwd_sent_bytes - base.payload_bwd_sent_bytes)
        probed = max(1, self.policy.timed_steps("dedup"))  # dedup's passes in the probe
        *agreed, none_b, dedup_b = self._agree([*self.policy.local_probe(), *counts,
                                                wire[0] / probed, wire[1] / probed], device)
        none_s, dedup_s, spread = agreed[0] / W, agreed[1] / W, max(agreed[2], agreed[3]) / W
        fractions = {t: (agreed[5 + 2 * i] / agreed[4 + 2 * i]) if agreed[4 + 2 * i] else 1.0
                     for i, t in enumerate(names)}
        bags = sum(agreed[4::2])
        overall = sum(agreed[5::2]) / bags if bags else None
        decision = self.policy.decide(none_s, dedup_s, overall, spread,
                                      Wire(none_b, dedup_b, link_bytes_per_s()) if none_b > 0 else None)
        self._probe_base = None
        reason = decision.reason
        if decision.choice == "dedup" and hasattr(self.dedup_dist.planner, "dedup_tables"):
            self.table_choice = self.policy.table_choices(fractions)
            coded = {t for t, c in self.table_choice.items() if c == "dedup"}
            if coded:
                self._set_dedup_tables(coded)
                plain = sorted(self.tables - coded)
                if plain:
                    reason += f"; tables {plain} uncompressed (distinct fraction >= " \
                              f"{self.policy.table_keep_fraction})"
            else:
                self.policy.choice = decision.choice = "none"
                reason += "; but every table's distinct fraction is >= " \
                          f"{self.policy.table_keep_fraction}: none"
        if decision.choice == "none":
            self.table_choice = {t: "none" for t in names}
        elif not hasattr(self.dedup_dist.planner, "dedup_tables"):
            self.table_choice = {t: "dedup" for t in names}
        decision.reason = reason
        self._note(f"{decision.head()} ({reason}; {self._fractions_text(fractions, overall)})")

    def _what(self) -> str:
        """The all-to-all in words: its sharding type and its tables (named when few)."""
        names = sorted(self.tables)
        return f"{self.sharding_type} {names[0]}" if len(names) == 1 else \
            f"{self.sharding_type}, {len(names)} tables" + (f" {names}" if len(names) <= 4 else "")

    @staticmethod
    def _fractions_text(fractions: dict[str, float], overall: float | None) -> str:
        """Distinct rows per batch: overall and per table (the extremes only when many)."""
        if not fractions:
            return "no distinct fractions measured"
        head = f"distinct rows per batch {overall:.0%}" if overall is not None else "distinct rows per batch"
        if len(fractions) <= 4:
            return head + " (" + ", ".join(f"{t} {f:.2f}" for t, f in fractions.items()) + ")"
        ranked = sorted(fractions.items(), key=lambda kv: kv[1])
        (lo, f_lo), (hi, f_hi) = ranked[0], ranked[-1]
        return f"{head} ({lo} {f_lo:.2f} to {hi} {f_hi:.2f}; every table in comm_stats.json)"

    def _check_drift(self, device: torch.device) -> None:
        frac = None
        if self.policy.choice == "dedup":
            tot = self.dedup_dist.comm_stats.tables.values()
            bags = sum(t.bags for t in tot)
            frac = sum(t.unique_bags for t in tot) / bags if bags else None
        drifted, = self._agree([float(self.policy.local_drift(frac))], device, op=dist.ReduceOp.MAX)
        if drifted:
            self.policy.reprobe()
            self._note(self.policy.reprobe_line("the step time or distinct fraction drifted"))

    def _note(self, line: str) -> None:
        """Print `line` and list it with the decisions (comm_stats.json's `auto_decisions`)."""
        self.none_stats.decisions.append(line)
        self._say(f"comm auto ({self._what()}): {line}")

    def _dedup_tables_snapshot(self) -> dict[str, TableCommStats]:
        return {t: dataclasses.replace(s) for t, s in self.dedup_dist.comm_stats.tables.items()}

    def _dedup_tables(self) -> set[str] | None:
        """The tables dedup's planner deduplicates (None: it always takes all)."""
        tables = getattr(self.dedup_dist.planner, "dedup_tables", None)
        return None if tables is None else set(tables)

    def _set_dedup_tables(self, tables: set[str]) -> None:
        planner = self.dedup_dist.planner
        if hasattr(planner, "dedup_tables"):
            planner.dedup_tables = set(tables)

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)
        logger.info(text)

    # ---------------------------------------------------------------- stats
    def counted_bytes(self) -> DistCommStats:
        """Both paths' counters as one codec dist's (`stats.CountsCommBytes`)."""
        return self.comm_stats

    @property
    def comm_stats(self) -> DistCommStats:
        """Both paths' counters as one codec dist's."""
        self._flush_settled()
        d = self.dedup_dist.comm_stats
        tables: dict[str, TableCommStats] = {}
        for src in (d.tables, self.none_stats.tables):
            for name, t in src.items():
                tables.setdefault(name, TableCommStats()).add(t)
        d.settle()  # its CUDA times read in (a copy below must not share the unread list)
        # the dedup path's counters (codec time, syncs, messages, hops), with both paths'
        # tables and steps and auto's own name, choices and decisions
        return dataclasses.replace(
            d, codec="auto", sharding_type=self.sharding_type, tables=tables,
            table_codecs={t: f"auto:{self.table_choice.get(t, 'none')}" for t in tables},
            steps=d.steps + self.none_stats.steps, decisions=list(self.none_stats.decisions),
            auto_steps=self._counted_steps(),
            ids_looked_up=d.ids_looked_up + self.none_stats.ids_looked_up,
            rows_looked_up=d.rows_looked_up + self.none_stats.rows_looked_up, hop_seconds=dict(d.hop_seconds))

    @comm_stats.setter
    def comm_stats(self, value: DistCommStats) -> None:
        """Restart the counters from `value` (tests count training steps only)."""
        self._settled_counts = {}
        d = self.dedup_dist.comm_stats
        self.dedup_dist.comm_stats = dataclasses.replace(value, codec=d.codec, table_codecs=d.table_codecs,
                                                         decisions=[])
        self.none_stats = DistCommStats(codec="none", sharding_type=self.sharding_type,
                                        decisions=list(self.none_stats.decisions))
