"""When `comm.codec=auto` uses `dedup` and when `none`: the decision logic alone (no torch).

`auto` must never make a run slower, and the only cost that settles that is
the training step itself: dedup's kernels, the bytes it saves, the link and
the overlap all land in it. So the policy times whole steps (the period
between two training passes through one all-to-all) under each path:

1. warm-up: `warmup_steps` steps, not timed, paths alternating from dedup
   (whose first step learns key widths and fills its buffer pools; one step
   is enough: a first-call cost left in a probe sample only delays a
   clear-cut end, and the stock path has none worth a step);
2. probe: the paths alternate for `probe_steps` steps each; the median step
   time per path is this rank's measurement. A clear-cut probe ends early:
   once each path has `min_probe_steps` samples, if every step of one path
   (on every rank: extremes agreed by the caller) beat every step of the other
   by more than `clear_margin`, waiting for more samples only costs steps on
   the slow path (at MLPerf's shape through 1 Gbit/s, `none` steps are ~1.7x
   `dedup`'s, and a short MLPerf run is ~30 steps);
3. decision: all ranks' medians and spreads (`local_probe`) are averaged by
   the caller (one small all-reduce, so every rank decides alike: both ends of
   a block must use the same codec) and `decide()` switches when the other path
   is faster by more than the band (`margin`, or the probe's own spread of step
   times where larger: the median absolute deviation of a path's steps, relative,
   the larger path's), keeps the current one when it is faster by more than the
   band (hysteresis; before the first decision the current path is `none`);
   what the caller knows of the bytes (`Wire`: each path's bytes a step and,
   behind a shaped link, its rate) is weighed and said in the decision line;
4. a close call stays open: a gap within the band, or a clear gap against what
   the bytes say (dedup would save more than `margin` of a `none` step on the
   link), is not a verdict. The cheaper-looking path runs (dedup where the bytes
   say so, else the current path) and both are timed again at the next check
   point (`check_every` steps on: `retime_due`): each re-timing adds `retime_steps`
   more steps of each path to the call's evidence (medians and spread over all its
   timings' steps, so the band narrows as they grow), until the gap is clear or
   `close_call_retimes` re-timings were made; then the last timing's clear winner
   is kept, or on a gap still within the band the cheaper-looking path, and the
   line says which and why. Adding to the evidence, not starting afresh, keeps an
   open call's cost on the slower path to `retime_steps` steps a re-timing;
5. steady: every `check_every` steps the caller asks `local_drift()` (again
   agreed over ranks); after at least `min_dwell` steps on one decision, a
   step time or distinct fraction that moved by more than `drift` from what
   the decision saw starts a new probe. Without drift the decision stays:
   no flapping. A step time needs `drift_samples` recent steps, so under a
   `none` decision the caller may skip timing altogether between checks
   (`untimed_steps`): only the `drift_samples` steps before each check point
   that can see drift are timed again (`advance` accounts the skipped ones).

A step time may be a float or anything `float()` reads (on CUDA a device interval,
comm/timing.py): samples are read only where the caller agrees them over ranks
(`local_extremes`, `local_medians`, `local_drift`), a host sync anyway.

Per table, within a `dedup` decision: a table whose distinct fraction is at
least `table_keep_fraction` saves almost no bytes yet pays its unique; it
travels uncompressed (`table_choices`).

The settings named above are `comm.auto`'s (config.schema.AutoConfig, which `AutoPolicy` extends
with its state; `AutoPolicy.of` builds one from a run's).
"""

from __future__ import annotations

import copy
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import SupportsFloat

from dlrmtrain.config.schema import AutoConfig

REPROBE = "timing both paths again"
"""how the line of a new probe (a re-timed close call, or drift) names it, after its step"""

PATHS = ("dedup", "none")
"""alternation order while warming up and probing (dedup first: its key widths are learned early)"""


LINK_RATE_ENV = "DLRMTRAIN_LINK_GBIT"
"""The rate, Gbit/s, of the shaped link the run trains behind (testbed/shaped_link.py sets it for
the command it runs): one link shared by all ranks and both directions"""


def _read(samples: list[SupportsFloat]) -> list[float]:
    """Step times as floats (a device interval is read here; a float stays itself)."""
    return [float(s) for s in samples]


def _spread(samples: list[float]) -> float:
    """The median absolute deviation of `samples` from their median, relative to it (0 for one)."""
    mid = statistics.median(samples)
    return statistics.median(abs(s - mid) for s in samples) / mid if mid > 0 else 0.0


def _fewest(samples: dict[str, list]) -> int:
    """The steps a probe has timed of the path it has timed least."""
    return min(len(s) for s in samples.values())


def link_bytes_per_s() -> float | None:
    """The shaped link's rate in bytes/s where the run trains behind one (LINK_RATE_ENV), else None."""
    gbit = os.environ.get(LINK_RATE_ENV)
    return float(gbit) * 1e9 / 8 if gbit else None


@dataclass(frozen=True)
class Wire:
    """What a probe knows for certain of the bytes: each path's bytes a training step crossing
    the link (summed over ranks: the shaped link is one link shared by all), and the link's rate
    where known (None: the bytes are said, not weighed)."""

    none_bytes: float
    dedup_bytes: float
    bytes_per_s: float | None = None

    def saved_share(self, none_seconds: float) -> float | None:
        """The link time dedup's fewer bytes save, as a share of a `none` step (None: rate unknown)."""
        if not self.bytes_per_s or none_seconds <= 0:
            return None
        return (self.none_bytes - self.dedup_bytes) / self.bytes_per_s / none_seconds

    def describe(self, none_seconds: float) -> str:
        if self.dedup_bytes <= 0 or self.none_bytes <= 0:
            return "bytes not counted"
        ratio = self.none_bytes / self.dedup_bytes
        sends = f"dedup sends {ratio:.1f}x fewer bytes" if ratio >= 1 else f"dedup sends {1 / ratio:.1f}x more bytes"
        share = self.saved_share(none_seconds)
        if share is None:
            return f"{sends} (link rate unknown: not weighed)"
        saved = (self.none_bytes - self.dedup_bytes) / self.bytes_per_s
        return f"{sends}: {saved * 1e3:.1f} ms a step through the {self.bytes_per_s * 8 / 1e9:g} Gbit/s link, " \
               f"{share:.0%} of a none step"


@dataclass
class AutoDecision:
    """One decision, as printed and listed in comm_stats.json's `auto_decisions`."""

    choice: str
    """`none` or `dedup`: the path every rank uses from now on"""
    reason: str
    """why, in words: the probe's times, or a table's distinct fraction"""
    step: int
    """the training step it was made at (the same on every rank)"""
    none_seconds: float | None = None
    """the probe's step time of each path (agreed over ranks); None where no probe timed it"""
    dedup_seconds: float | None = None
    settled: bool = True
    """False: a close call, kept open (both paths are timed again at the next check point)"""

    def head(self) -> str:
        """How its line begins (comm_stats.json's `auto_decisions`, read back by timeline.py)."""
        return f"step {self.step}: {self.choice}" + ("" if self.settled else " for now")


@dataclass
class AutoPolicy(AutoConfig):
    """`auto`'s settings (the numbered phases above; each field's meaning: config.schema.AutoConfig,
    `comm.auto`) and its state; the same on every rank."""

    # state (not settings: `dataclasses.replace(policy)` gives a fresh policy with the same settings)
    phase: str = field(default="warmup", init=False)
    choice: str = field(default="none", init=False)
    step: int = field(default=0, init=False)
    """training steps seen (all ranks count alike: the same SPMD passes)"""
    decisions: list[AutoDecision] = field(default_factory=list, init=False)
    _phase_start: int = field(default=0, init=False)
    _samples: dict = field(default_factory=lambda: {p: [] for p in PATHS}, init=False)
    _reference: float | None = field(default=None, init=False)
    _reference_fraction: float | None = field(default=None, init=False)
    _recent: list = field(default_factory=list, init=False)
    _open: int = field(default=0, init=False)
    """timings of the current question that ended in a close call (0: none open)"""
    _evidence: dict = field(default_factory=lambda: {p: [] for p in PATHS}, init=False)
    """an open close call's timed steps per path so far (a re-timing adds to them)"""
    _carried: int = field(default=0, init=False)
    """steps per path the running probe took over from the open call's evidence"""
    steps_after_probe: int = field(default=0, init=False)
    """training steps counted from the first decision on (ints, so a `copy.copy` shares none)"""
    dedup_steps_after_probe: int = field(default=0, init=False)
    """of them, those that took dedup: the share `auto` ran dedup, exact (a pipeline's batches
    picked ahead keep their path across a probe's start: the decision lines alone cannot say)"""

    @classmethod
    def of(cls, settings: AutoConfig) -> AutoPolicy:
        """A fresh policy with `settings` (the run's `comm.auto`)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(AutoConfig)})

    # ------------------------------------------------------------- per step
    def path(self) -> str:
        """The path the current training step uses (the same on every rank)."""
        if self.phase in ("warmup", "probe"):
            return PATHS[(self.step - self._phase_start) % 2]
        return self.choice

    def observe(self, seconds: SupportsFloat, used: str | None = None) -> None:
        """The time of the step just finished (it used `path()`, or `used` where the caller fixed
        its path earlier: auto at the source under a pipeline); then advance one step."""
        used = used or self.path()
        self._count(used)
        if self.phase == "probe":
            self._samples[used].append(seconds)
        elif self.phase == "steady" and used == self.choice:
            # at least `drift_samples` kept (comm.auto may set more than 16: never enough otherwise)
            self._recent = (self._recent + [seconds])[-max(16, self.drift_samples):]
        self.step += 1
        if self.phase == "warmup" and self.step - self._phase_start >= self.warmup_steps:
            self._start("probe")

    def skip(self, used: str | None = None) -> None:
        """Advance one step without a time (the period held something else, e.g. an evaluation);
        it used `path()`, or `used` (as `observe`)."""
        self._count(used or self.path())
        self.step += 1
        if self.phase == "warmup" and self.step - self._phase_start >= self.warmup_steps:
            self._start("probe")

    def _count(self, used: str) -> None:
        if self.decisions:
            self.steps_after_probe += 1
            self.dedup_steps_after_probe += used == "dedup"

    def counted_steps(self) -> tuple[int, int]:
        """(training steps from the first decision on, those that took dedup): comm_stats.json's
        `auto_steps_after_probe`, which the runner's line per run reads (timeline.py)."""
        return self.steps_after_probe, self.dedup_steps_after_probe

    def path_ahead(self, picked: Sequence[str]) -> str:
        """The path of the training step after those `picked` (the paths of the batches picked
        for the steps from the current one on, not yet trained), were each observed as the path
        it took: a pick that left the probe's turns must not count as one (a decision or drift
        check on the way may still change the path). A step the running probe will have ended
        before takes the path a decision put in force (a re-timed close call's cheaper-looking
        path), not the probe's next turn, which would time nothing; before the first decision
        the turns go on (half of such steps take dedup, not all none)."""
        ahead = copy.copy(self)
        ahead._samples = {p: list(s) for p, s in self._samples.items()}
        for path in picked:  # a probe that is complete stays so as steps are added
            ahead.observe(0.0, path)
        return self.choice if self.decisions and ahead.needs_decision() else ahead.path()

    def next_paths(self, advanced: int = 0, timed: bool | None = True) -> set[str]:
        """The paths the next training step may take, known before it starts (to plan its pass
        ahead). The caller says what it will count first: `advanced` untimed steps, then one
        step `observe`d (`timed` True), `skip`ped (False) or neither (None). Both paths where
        that step may decide (an agreement over ranks settles it then); a drift check may
        re-probe, which starts with PATHS[0]."""
        ahead = copy.copy(self)
        ahead._samples = {p: list(s) for p, s in self._samples.items()}  # the only state mutated in place
        if advanced:
            ahead.advance(advanced)
        if timed is True:
            ahead.observe(0.0)
        elif timed is False:
            ahead.skip()
        if ahead.needs_decision() or ahead.early_check_due():
            return set(PATHS)
        if ahead.check_due():
            return {ahead.path(), PATHS[0]}
        return {ahead.path()}

    def _start(self, phase: str, evidence: dict | None = None) -> None:
        self.phase, self._phase_start = phase, self.step
        self._samples = {p: list((evidence or {}).get(p, [])) for p in PATHS}
        self._carried = _fewest(self._samples)

    # ----------------------------------------------------------- decisions
    def needs_decision(self) -> bool:
        """Probe complete: the caller agrees `local_probe()` over ranks and calls `decide`."""
        return self.phase == "probe" and all(len(s) >= self.probe_length() for s in self._samples.values())

    def early_check_due(self) -> bool:
        """A probe step where a clear-cut result may end it (the same steps on every rank):
        the caller agrees `local_extremes()` over ranks (MAX) and asks `clear_cut`."""
        n_none, n_dedup = (len(self._samples[p]) for p in ("none", "dedup"))
        # a re-timing may end early only on its own new steps (the carried ones were a close call)
        return self.phase == "probe" and n_none == n_dedup and \
            self.min_probe_steps <= n_none - self._carried and n_none < self.probe_length()

    def probe_length(self) -> int:
        """Timed steps per path the running probe ends with: `probe_steps`; a re-timing of an open
        close call, `retime_steps` more than the evidence it carried over."""
        return self._carried + self.retime_steps if self._carried else self.probe_steps

    def local_extremes(self) -> list[float]:
        """[slowest none, -fastest none, slowest dedup, -fastest dedup] of the running probe's own
        steps (a re-timing's new ones): a MAX over ranks gives the global ones."""
        none, dedup = (_read(self._samples[p][self._carried:]) for p in ("none", "dedup"))
        return [max(none), -min(none), max(dedup), -min(dedup)]

    def _decisive(self) -> dict[str, list]:
        """The steps a decision now rests on: a probe cut short by a clear-cut result, its own
        (an open call's earlier steps were close: the new ones alone are decisive); one that ran
        its length, all of the call's evidence."""
        cut_short = _fewest(self._samples) < self.probe_length()
        return {p: s[self._carried:] if cut_short else s for p, s in self._samples.items()}

    def clear_cut(self, extremes: list[float]) -> bool:
        """Every step of one path beat every step of the other by more than `clear_margin`."""
        none_max, none_min, dedup_max, dedup_min = extremes[0], -extremes[1], extremes[2], -extremes[3]
        return dedup_max * (1 + self.clear_margin) < none_min or none_max * (1 + self.clear_margin) < dedup_min

    def local_medians(self) -> tuple[float, float]:
        steps = self._decisive()
        return statistics.median(_read(steps["none"])), statistics.median(_read(steps["dedup"]))

    def timed_steps(self, path: str) -> int:
        """Steps of `path` the running probe has timed."""
        return len(self._samples[path])

    def local_probe(self) -> list[float]:
        """[none median, dedup median, none spread, dedup spread] of this rank's probe (a sum over
        ranks divided by their number gives the agreed ones: `decide(n, d, f, max(spreads))`);
        a spread: the relative median absolute deviation of the path's steps, times
        sqrt(probe_steps / its steps)."""
        steps = self._decisive()
        none, dedup = _read(steps["none"]), _read(steps["dedup"])
        # a median's own noise shrinks as the square root of its steps: a re-timing with 4x the
        # steps of a first probe has half its band
        narrower = math.sqrt(self.probe_steps / max(1, min(len(none), len(dedup))))
        return [statistics.median(none), statistics.median(dedup), _spread(none) * narrower,
                _spread(dedup) * narrower]

    def decide(self, none_seconds: float, dedup_seconds: float, distinct_fraction: float | None = None,
               spread: float = 0.0, wire: Wire | None = None) -> AutoDecision:
        """Choose from step times agreed over ranks (identical inputs give identical choices);
        `spread`: the probe's relative spread of step times; `wire`: what is known of the bytes."""
        times = {"none": none_seconds, "dedup": dedup_seconds}
        current = self.choice
        other = "dedup" if current == "none" else "none"
        gain = 1.0 - times[other] / times[current] if times[current] > 0 else 0.0
        band = max(abs(self.margin), spread)
        switch_at = self.margin if self.margin < 0 else band  # a negative margin (switch even if slower) as set
        clear = other if gain > switch_at else current if gain < -band else None
        share = wire.saved_share(none_seconds) if wire else None
        bytes_say = "dedup" if share is not None and share > self.margin else None
        if clear is not None and bytes_say in (None, clear):
            choice, reason = clear, self._clear_reason(times, current, gain, band)
            self._open = 0
        else:
            # the cheaper-looking path; at the cap, a clear gap stands against the bytes
            at_cap = self._open >= self.close_call_retimes
            choice = (clear if at_cap else None) or bytes_say or clear or current
            timings, self._open = self._open + 1, 0 if at_cap else self._open + 1
            reason = self._close_reason(times, choice, current, gain, band, clear, share, timings)
        if wire is not None:
            reason += f"; weighed: {wire.describe(none_seconds)}"
        decision = AutoDecision(choice, reason, self.step, none_seconds, dedup_seconds, settled=self._open == 0)
        self.decisions.append(decision)
        self.choice = choice
        self._reference = times[choice]
        self._reference_fraction = distinct_fraction
        self._recent = []
        self._evidence = self._samples if self._open else {p: [] for p in PATHS}
        self._start("steady")
        return decision

    def _measured(self, times: dict[str, float], current: str, other: str) -> str:
        return f"a {other} step took {times[other] * 1e3:.1f} ms, a {current} step {times[current] * 1e3:.1f} ms"

    def _band(self, band: float) -> str:
        return f"the {self.margin:.0%} margin" if band <= abs(self.margin) else f"the steps' own spread ({band:.1%})"

    def _clear_reason(self, times: dict[str, float], current: str, gain: float, band: float) -> str:
        other = "dedup" if current == "none" else "none"
        measured = self._measured(times, current, other)
        if gain > 0:
            return f"{measured}: {other} is {gain:.1%} faster (> {self._band(band)})"
        return f"{current} kept: {measured}; {other} is {-gain:.1%} slower (beyond {self._band(band)})"

    def _close_reason(self, times: dict[str, float], choice: str, current: str, gain: float, band: float,
                      clear: str | None, share: float | None, timings: int) -> str:
        """A close call (or a clear gap against the bytes) after `timings` timings: open, or
        settled at the cap (`_open` says which, already counted)."""
        other = "dedup" if current == "none" else "none"
        verdict = f"{gain:.1%} faster" if gain >= 0 else f"{-gain:.1%} slower"
        what = f"{self._measured(times, current, other)}; {other} is {verdict}"
        if clear is None:
            what = f"close call: {what}, within {self._band(band)}"
        else:
            what = f"against the bytes: {what}, yet dedup's fewer bytes would save {share:.0%} of a none step"
        why = "the bytes say it saves" if choice == "dedup" and share is not None and share > self.margin \
            else "measured faster" if choice == clear else "the path it was on"
        if self._open:
            return f"{what}; {choice} kept for now ({why}), both timed again at step " \
                   f"{self.step + self.check_every} with {self.retime_steps} more steps each " \
                   f"({_fewest(self._samples) + self.retime_steps} in all)"
        return f"{what}; {choice} kept after {timings} timings ({why})"

    def retime_due(self) -> bool:
        """A check point with a close call open: the caller re-probes (`reprobe`) without asking
        the ranks (the open call and its schedule are the same on every rank)."""
        return self._open > 0 and self.check_due()

    def retime_line(self) -> str:
        return self.reprobe_line(f"the close call of step {self.decisions[-1].step}")

    def reprobe_line(self, why: str) -> str:
        """The line of a new probe starting now (call after `reprobe`; listed with the decisions)."""
        steps = f"{self.probe_length() - self._carried} more steps each, {self.probe_length()} in all" \
            if self._carried else f"{self.probe_length()} steps each"
        return f"step {self.step}: {REPROBE} ({steps}): {why}"

    def check_due(self) -> bool:
        """Whether this step is a drift check point (the same steps on every rank)."""
        return self.phase == "steady" and (self.step - self._phase_start) % self.check_every == 0 \
            and self.step > self._phase_start

    def local_drift(self, distinct_fraction: float | None = None) -> bool:
        """This rank's view: has the chosen path's step time or distinct fraction moved by > `drift`?"""
        if self.step - self._phase_start < self.min_dwell or self._reference is None:
            return False
        if len(self._recent) >= self.drift_samples:
            now = statistics.median(_read(self._recent))
            if abs(now - self._reference) > self.drift * self._reference:
                return True
        if distinct_fraction is not None and self._reference_fraction is not None:
            return abs(distinct_fraction - self._reference_fraction) > self.drift * self._reference_fraction
        return False

    def untimed_steps(self) -> int:
        """Steady: training steps, from the current one on, that need no timing: those before
        the `drift_samples` timed ones that precede the next check point able to see drift."""
        if self.phase != "steady":
            return 0
        if self._open:  # re-timed at the next check point, whatever the dwell
            return max(0, self._phase_start + self.check_every - self.step)
        since = self.step - self._phase_start
        checks = max(1, -(-max(self.min_dwell, since + 1) // self.check_every))  # ceil
        next_check = self._phase_start + checks * self.check_every
        return max(0, next_check - self.drift_samples - self.step)

    def advance(self, steps: int) -> None:
        """`steps` steady training steps ran untimed (`untimed_steps`): count them; the recent
        step times are stale now."""
        self.step += steps
        if self.decisions:
            self.steps_after_probe += steps
            self.dedup_steps_after_probe += steps if self.choice == "dedup" else 0
        self._recent = []

    def reprobe(self) -> None:
        """Some rank saw drift (agreed by the caller), or a close call is re-timed: probe both
        paths again, until `probe_length` steps each (a re-timing adds to the open call's
        evidence; drift starts afresh: what the decision saw is what moved)."""
        self._start("probe", self._evidence if self._open else None)

    def table_choices(self, distinct_fraction: dict[str, float]) -> dict[str, str]:
        """Under `dedup`: `none` for tables whose (agreed) distinct fraction leaves almost nothing to save."""
        return {t: "none" if f >= self.table_keep_fraction else "dedup" for t, f in distinct_fraction.items()}
