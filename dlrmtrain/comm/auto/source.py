"""`comm.codec: auto` with `comm.dedup_at: source`: per training step, the full batch (`none`) or its
distinct bags (`dedup` at the source), whichever `AutoPolicy` (policy.py) measures faster.

The choice is made before the batch reaches the sharded EBC, so it is made per batch, not per
all-to-all: the row loader's prefetch thread builds both forms of every batch (the full KJT in
`sparse_features`, the variable-batch KJT of its distinct bags in `distinct_features`), and
`pick` hands the step the one its path takes. Both run through TorchRec's stock dists and give
`none`'s forward bitwise, so a step may take either. The step is timed from `pick` to
`step_ended` (the forward, backward and optimizer step, nothing else), on the device's clock
(comm/timing.py); the policy's decisions and drift checks are agreed over ranks as `AutoDist`'s.
The drift check also watches the batch's distinct fraction (host integers, free). All features
take the chosen path (no per-table choice). Evaluation batches take the current choice (`none`
while probing). The plain loop only: a pipeline starts a batch's input dist a step or two before
its training step, so the path a step takes is not the one the policy has for it (the design
for pipelines: comm/README.md, "Dedup at the source").
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
import torch.distributed as dist

from dlrmtrain.comm import timing
from dlrmtrain.comm.auto.policy import AutoPolicy
from dlrmtrain.comm.stats import COUNTERS_ATTR, DistCommStats

logger = logging.getLogger(__name__)


def distinct_fraction(batch: Any) -> float | None:
    """Distinct bags / bags of a batch carrying both forms (host integers), None without them."""
    distinct = getattr(batch, "distinct_features", None)
    if distinct is None:
        return None
    bags = len(distinct.keys()) * batch.sparse_features.stride()
    return sum(s[0] for s in distinct.stride_per_key_per_rank()) / bags if bags else None


class SourceAuto:
    """Chooses, per training step, the form of the batch the sharded EBC is given."""

    def __init__(self, policy: AutoPolicy, device: torch.device, group: dist.ProcessGroup | None = None,
                 rank: int = 0) -> None:
        self.policy, self.device, self.group, self.rank = policy, device, group, rank
        self._started: timing.Stamp | None = None
        self._fraction: float | None = None
        self.decisions: list[str] = []
        self._say(f"comm auto (dedup at the source): timing none and dedup steps in turn over the first "
                  f"{policy.warmup_steps + 2 * policy.min_probe_steps}-{policy.warmup_steps + 2 * policy.probe_steps}"
                  f" training steps; dedup is used only if its step is > {policy.margin:.0%} faster")

    def pick(self, batch: Any) -> Any:
        """The training batch in the form this step's path takes; the step's clock starts."""
        self._fraction = distinct_fraction(batch)
        self._started = timing.stamp(self.device)
        return self._form(batch, self.policy.path())

    def pick_for_eval(self, batch: Any) -> Any:
        """An evaluation batch in the current choice's form (`none` while probing)."""
        return self._form(batch, self.policy.choice if self.policy.phase == "steady" else "none")

    @staticmethod
    def _form(batch: Any, path: str) -> Any:
        distinct = getattr(batch, "distinct_features", None)
        if distinct is None:
            raise ValueError("comm.codec: auto with comm.dedup_at: source needs batches carrying their "
                             "distinct bags (the row loader's, set_sparse_transform(keep_full=True))")
        sparse = distinct if path == "dedup" else batch.sparse_features
        return dataclasses.replace(batch, sparse_features=sparse, distinct_features=None)

    def step_ended(self) -> None:
        """The step `pick` started has ended: time it, then decide or check drift where due."""
        if self._started is None:
            return
        self.policy.observe(timing.elapsed(self._started, timing.stamp(self.device)))
        self._started = None
        if self.policy.needs_decision() or (self.policy.early_check_due() and self.policy.clear_cut(
                self._agree(self.policy.local_extremes(), dist.ReduceOp.MAX))):
            self._decide()
        elif self.policy.check_due():
            drifted, = self._agree([float(self.policy.local_drift(self._fraction))], dist.ReduceOp.MAX)
            if drifted:
                self._say(f"comm auto (dedup at the source): step time or distinct fraction drifted at "
                          f"step {self.policy.step}; timing both paths again")
                self.policy.reprobe()

    def _decide(self) -> None:
        W = dist.get_world_size(self.group) if dist.is_initialized() else 1
        none_s, dedup_s, fraction = (v / W for v in self._agree(
            [*self.policy.local_medians(), self._fraction or 0.0]))
        decision = self.policy.decide(none_s, dedup_s, fraction if self._fraction is not None else None)
        line = f"step {decision.step}: {decision.choice} ({decision.reason})"
        self.decisions.append(line)
        self._say(f"comm auto (dedup at the source) {line}")

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
        return DistCommStats(codec="auto", sharding_type="source", decisions=list(self.decisions))


def attach_source_auto(model: torch.nn.Module, device: torch.device, policy: AutoPolicy | None = None) -> SourceAuto:
    """A `SourceAuto` for sharded `model` (default process group), its decisions listed with the
    first sharded module's comm counters (comm_stats.json's `auto_decisions`)."""
    auto = SourceAuto(policy or AutoPolicy(), device, rank=dist.get_rank() if dist.is_initialized() else 0)
    holder = next((m for m in model.modules() if hasattr(m, COUNTERS_ATTR)), None)
    if holder is not None:
        setattr(holder, COUNTERS_ATTR, [*getattr(holder, COUNTERS_ATTR), auto])
    return auto
