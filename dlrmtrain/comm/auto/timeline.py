"""What `auto` chose and when, in one line per run, read back from its listed decisions.

comm_stats.json's `auto_decisions` lists, per all-to-all (prefixed by its sharding type, or
`source`), each decision as `step N: CHOICE (reason)` (`step N: CHOICE for now (...)` while a
close call is open) and each new probe as `step N: timing both paths again (...)`
(policy.py: `AutoDecision.head`, `AutoPolicy.reprobe_line`); `auto_steps_after_probe` counts,
per all-to-all, the training steps from the first decision on and those that took dedup.
`run_line` turns them into e.g.
`source: dedup at step 13 for now, timed again at 63, dedup at step 77; dedup on 97.5% of the steps after the probe (237 of 243)`
(the MLPerf runner's summary and `dlrmtrain report` print it per run). Runs written before the
count existed get the share estimated from the lines (a probe's steps half on each path), which
a pipeline's batches picked ahead of a probe's start make slightly low.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dlrmtrain.comm.auto.policy import REPROBE

_LINE = re.compile(r"^(?P<where>.*?)\s*step (?P<step>\d+): (?P<what>none|dedup|" + re.escape(REPROBE)
                   + r")(?P<open> for now)?\b")


@dataclass(frozen=True)
class Event:
    step: int
    what: str
    """`none` or `dedup` (a decision), or `probe` (both paths timed from here)"""
    open: bool = False
    """a decision of a close call still open"""


def events_of(lines: list[str]) -> dict[str, list[Event]]:
    """Per all-to-all (its prefix; '' for none), its events in step order. Lines of another
    form are skipped."""
    events: dict[str, list[Event]] = {}
    for line in lines:
        m = _LINE.match(line)
        if m is None:
            continue
        what = "probe" if m["what"] == REPROBE else m["what"]
        events.setdefault(m["where"], []).append(Event(int(m["step"]), what, m["open"] is not None))
    return {k: sorted(v, key=lambda e: e.step) for k, v in events.items()}


def dedup_share(events: list[Event], steps: int) -> float | None:
    """The share of training steps from the first decision to `steps` that took dedup (a probe's
    steps alternate: half each); None before any decision."""
    first = next((e.step for e in events if e.what != "probe"), None)
    if first is None or steps <= first:
        return None
    dedup = 0.0
    bounds = [e for e in events if e.step >= first] + [Event(steps, "end")]
    for here, after in zip(bounds, bounds[1:]):
        span = min(after.step, steps) - here.step
        dedup += span if here.what == "dedup" else span / 2 if here.what == "probe" else 0
    return dedup / (steps - first)


def _events_text(events: list[Event]) -> str:
    parts = []
    for e in events:
        if e.what == "probe":
            parts.append(f"timed again at {e.step}")
        else:
            parts.append(f"{e.what} at step {e.step}" + (" for now" if e.open else ""))
    return ", ".join(parts)


def run_line(lines: list[str], steps: int, counted: dict[str, dict[str, int]] | None = None) -> str:
    """One line: per all-to-all its decisions and probes, and the share of steps on dedup:
    counted (comm_stats.json's `auto_steps_after_probe`, per all-to-all: `steps` from the first
    decision on, `dedup` of them) where the run counted it, else estimated from the lines."""
    per_dist = events_of(lines)
    if not per_dist:
        return "no decision (the run ended before auto's probe did)"
    texts = []
    for where, events in per_dist.items():
        count = (counted or {}).get(where)
        if count and count["steps"]:
            tail = f"; dedup on {count['dedup'] / count['steps']:.1%} of the steps after the probe " \
                   f"({count['dedup']} of {count['steps']})"
        else:
            share = dedup_share(events, steps)
            tail = "" if share is None else f"; dedup on {share:.0%} of the steps after the probe"
        texts.append(f"{where + ': ' if where else ''}{_events_text(events)}{tail}")
    return " | ".join(texts)
