"""`comm.codec: auto` where the batch is made (comm/placement.py's sample side): per training step,
the full batch (`none`) or its distinct bags or ids (`dedup` at the source), whichever `AutoPolicy`
(policy.py) measures faster; `AutoSampleSide` is the codec's sample side, `SourceAuto` the picker.

The choice is made before the batch reaches the sharded module, so it is made per batch, not per
all-to-all: the loader's prefetch thread builds both forms of every batch (pooled, the row
loader's: the full KJT in `sparse_features`, the variable-batch KJT of its distinct bags in
`distinct_features`; sequence, the Yambda loader's: the full KJT in `sparse`, the
`DistinctIdsKJT` of each table's distinct ids in `distinct_sparse`), and `pick` hands the batch on
in the form its training step's path takes. Both run through TorchRec's stock dists (the sequence
EC, `SourceDedupShardedEC`, sends a KJT without its expansion whole) and give `none`'s forward
bitwise, so any step may take either.

A pipeline takes a batch one or two steps before its training step (its input dist starts
early), so `pick` chooses by the policy's path that many steps ahead (`path_ahead`, given the
paths of the batches picked and not yet trained; a step after a running probe's end takes the
path in force) and
queues the path; `step_ended` times the step's period (from the
previous step's end, on the device's clock, comm/timing.py, as `AutoDist`) under the path its
batch actually took. Where a decision or a drift check changes the path after a batch was
picked, that batch keeps its form: lossless either way, and timed as what it took. A period that
held an evaluation is not timed. Decisions and drift checks are agreed over ranks as
`AutoDist`'s; the drift check also watches the batch's distinct fraction (host integers, free:
distinct bags / bags pooled, distinct ids / positions sequence).
All features take the chosen path (no per-table choice). Evaluation batches take the current
choice (`none` while probing).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dlrmtrain.comm import timing
from dlrmtrain.comm.auto.policy import AutoPolicy, Wire, link_bytes_per_s
from dlrmtrain.comm.codec import SampleSide
from dlrmtrain.comm.labels import PLACEMENT_KEY
from dlrmtrain.comm.stats import CommCounters, DistCommStats

logger = logging.getLogger(__name__)


BOTH_FORMS = (("sparse_features", "distinct_features"), ("sparse", "distinct_sparse"))
"""(full KJT, distinct KJT) attribute names of the batches that carry both: the row loader's
`PooledBatch`, the sequence loader's `SequenceBatch`"""


def _forms_of(batch: Any) -> tuple[str, str] | None:
    return next(((full, distinct) for full, distinct in BOTH_FORMS if hasattr(batch, distinct)), None)


def rows_of_both_forms(batch: Any) -> tuple[int, int] | None:
    """(rows the full batch moves, rows its distinct form moves): bags and distinct bags (pooled:
    a variable-batch KJT) or positions and distinct ids (sequence) of a batch carrying both forms
    (host integers), None without them."""
    names = _forms_of(batch)
    distinct = None if names is None else getattr(batch, names[1])
    if distinct is None:
        return None
    full = getattr(batch, names[0])
    if not distinct.variable_stride_per_key():
        # the positions the sharded EC takes (its shardings' features: a feature of none is not sent)
        expansion = getattr(distinct, "expansion", None)
        positions = (sum(f.values().numel() for f in expansion.features) if expansion is not None
                     else full.values().numel())
        return positions, distinct.values().numel()
    return len(distinct.keys()) * full.stride(), sum(s[0] for s in distinct.stride_per_key_per_rank())


def distinct_fraction(batch: Any) -> float | None:
    """Distinct bags / bags (pooled) or distinct ids / positions (sequence) of a batch carrying
    both forms (host integers), None without them."""
    rows = rows_of_both_forms(batch)
    return rows[1] / rows[0] if rows and rows[0] else None


class SourceAuto:
    """Chooses, per training step, the form of the batch the sharded EBC is given."""

    def __init__(self, policy: AutoPolicy, device: torch.device, group: dist.ProcessGroup | None = None,
                 rank: int = 0, counters: Callable[[], list] | None = None) -> None:
        """`counters`: the stock dists' byte counters (`stats.CountsCommBytes`), read at a decision
        for the bytes a row moves (None: the bytes are not weighed)."""
        self.policy, self.device, self.group, self.rank = policy, device, group, rank
        self._counters = counters
        self._rows = [0, 0, 0]  # rows of the full and distinct forms, batches, since the last decision
        self._picked: collections.deque[str] = collections.deque()  # paths of batches not yet trained
        self._last_end: timing.Stamp | None = None
        self._untimed = False  # the running period held something else (an evaluation)
        self._fraction: float | None = None
        self.decisions: list[str] = []
        self._say(f"comm auto (dedup at the source): timing none and dedup steps in turn over the first "
                  f"{policy.warmup_steps + 2 * policy.min_probe_steps}-{policy.warmup_steps + 2 * policy.probe_steps}"
                  f" training steps; dedup is used only if its step is > {policy.margin:.0%} faster")

    def pick(self, batch: Any) -> Any:
        """The training batch in the form its step's path takes (that step is the first one after
        the batches picked before it)."""
        self._fraction = distinct_fraction(batch)
        rows = rows_of_both_forms(batch)
        if rows is not None:
            self._rows = [self._rows[0] + rows[0], self._rows[1] + rows[1], self._rows[2] + 1]
        path = self.policy.path_ahead(self._picked)
        self._picked.append(path)
        return self._form(batch, path)

    def pick_for_eval(self, batch: Any) -> Any:
        """An evaluation batch in the current choice's form (`none` while probing); the training
        period it runs in is not timed."""
        self._untimed = True
        return self._form(batch, self.policy.choice if self.policy.phase == "steady" else "none")

    @staticmethod
    def _form(batch: Any, path: str) -> Any:
        names = _forms_of(batch)
        if names is None or getattr(batch, names[1]) is None:
            raise ValueError(f"comm.codec: auto with {PLACEMENT_KEY}: source needs batches carrying their "
                             "distinct bags or ids (the row or sequence loader's, "
                             "set_sparse_transform(keep_full=True))")
        full, distinct = names
        sparse = getattr(batch, distinct if path == "dedup" else full)
        return dataclasses.replace(batch, **{full: sparse, distinct: None})

    def step_ended(self) -> None:
        """A training step has ended (it trained the oldest picked batch): time its period, then
        decide or check drift where due."""
        used = self._picked.popleft() if self._picked else None
        now = timing.stamp(self.device)
        if self._last_end is None or self._untimed or used is None:
            self.policy.skip(used)
        else:
            self.policy.observe(timing.elapsed(self._last_end, now), used)
        self._last_end, self._untimed = now, False
        if self.policy.needs_decision() or (self.policy.early_check_due() and self.policy.clear_cut(
                self._agree(self.policy.local_extremes(), dist.ReduceOp.MAX))):
            self._decide()
        elif self.policy.retime_due():
            self.policy.reprobe()
            self._note(self.policy.retime_line())
        elif self.policy.check_due():
            drifted, = self._agree([float(self.policy.local_drift(self._fraction))], dist.ReduceOp.MAX)
            if drifted:
                self.policy.reprobe()
                self._note(self.policy.reprobe_line("the step time or distinct fraction drifted"))

    def _note(self, line: str) -> None:
        self.decisions.append(line)
        self._say(f"comm auto (dedup at the source) {line}")

    def _decide(self) -> None:
        W = dist.get_world_size(self.group) if dist.is_initialized() else 1
        full, distinct = self._bytes_per_step(W)
        *agreed, full, distinct = self._agree([*self.policy.local_probe(), self._fraction or 0.0, full, distinct])
        none_s, dedup_s, none_spread, dedup_spread, fraction = (v / W for v in agreed)
        wire = Wire(full, distinct, link_bytes_per_s()) if full > 0 else None
        decision = self.policy.decide(none_s, dedup_s, fraction if self._fraction is not None else None,
                                      max(none_spread, dedup_spread), wire)
        self._rows = [0, 0, 0]
        self._note(f"{decision.head()} ({decision.reason})")

    def _bytes_per_step(self, world_size: int) -> tuple[float, float]:
        """This rank's bytes a step of each form sends to other ranks, ids and rows both ways (a row
        weighs what the counters counted so far; ids are few beside rows): (full, distinct), zeros
        where nothing is known."""
        full, distinct, batches = self._rows
        if self._counters is None or not batches:
            return 0.0, 0.0
        sent = rows = 0
        for counter in self._counters():
            for t in counter.counted_bytes().tables.values():
                sent += t.payload_fwd_sent_bytes + t.payload_bwd_sent_bytes + t.id_sent_bytes
                rows += t.rows_sent
        # a row crosses the link unless its owner is its sample rank: (W - 1) / W of them
        per_row = sent / rows * (world_size - 1) / world_size if rows else 0.0
        return full / batches * per_row, distinct / batches * per_row

    def _agree(self, values: list[float], op=dist.ReduceOp.SUM) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if dist.is_initialized():
            dist.all_reduce(t, op=op, group=self.group)
        return t.tolist()

    def _say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)
        logger.info(text)

    def counted_bytes(self) -> DistCommStats:
        """Its decisions, as a dist's without tables (`stats.CountsCommBytes`): the stock
        dists' counters count what each path sent."""
        return DistCommStats(codec="auto", sharding_type="source", decisions=list(self.decisions),
                             auto_steps=self.policy.counted_steps())


class AutoSampleSide(SampleSide):
    """`auto` where the batch is made (codec.SampleSide): dedup's sample side (`inner`: the same
    sharder, install and transform), the loader keeping the full batch beside, and a `SourceAuto`
    under `policy` picking the form of each training batch."""

    def __init__(self, inner: SampleSide, policy: AutoPolicy) -> None:
        self.inner, self.policy = inner, policy

    def sharder(self, fused_params: dict[str, Any]) -> Any:
        return self.inner.sharder(fused_params)

    def install(self, model: torch.nn.Module) -> None:
        self.inner.install(model)

    def transform(self, model: torch.nn.Module, whole_tables: frozenset[str]) -> Callable:
        return self.inner.transform(model, whole_tables)

    def picker(self, device: torch.device, counters: CommCounters) -> SourceAuto:
        """A `SourceAuto` on the default process group, its decisions added to `counters`
        (comm_stats.json's `auto_decisions`); it weighs the stock dists' counters, those added
        before it."""
        stock = list(counters)  # the stock dists' (before auto joins them)
        auto = SourceAuto(dataclasses.replace(self.policy), device,
                          rank=dist.get_rank() if dist.is_initialized() else 0, counters=lambda: stock)
        counters.add(auto)
        return auto
