"""Byte and time counters of the embedding all-to-all, per table, and their summary.

Codec dists add to a `DistCommStats` each step (host integers only: the counts
come from the one host sync the all-to-all needs anyway). Every counter of an
all-to-all (the codec dists, `none`'s stock counters) is a `CountsCommBytes`,
added to the run's `CommCounters` where it is made; `collect_comm_stats` gathers
them into one JSON-serialisable dict for the run directory (`run/console.py`
renders it for the console).
All figures are this rank's: bytes it put into / took out of the collectives
(its own block included, as the all-to-all split sizes include it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Protocol, TypeVar, runtime_checkable

import torch
import torch.distributed as dist

from dlrmtrain.comm.timing import DeviceInterval, Elapsed
from dlrmtrain.comm.topology import FLAT, Hierarchy


@dataclass
class TableCommStats:
    """Counters of one embedding table on one rank (bytes summed over its column shards; bags and
    rows whole, counted on its first column shard)."""

    bags: int = 0
    """bags this rank received pooled embeddings for (as sample rank)"""
    unique_bags: int = 0
    """distinct bags among them: rows that actually crossed the wire"""
    payload_fwd_sent_bytes: int = 0
    payload_fwd_recv_bytes: int = 0
    payload_bwd_sent_bytes: int = 0
    payload_bwd_recv_bytes: int = 0
    uncompressed_fwd_sent_bytes: int = 0
    """what the stock all-to-all would have sent forward (B·D·element size per block)"""
    uncompressed_fwd_recv_bytes: int = 0
    id_sent_bytes: int = 0
    """ids and lengths this rank sent in the input (id) all-to-all"""
    id_recv_bytes: int = 0
    rows_sent: int = 0
    """rows this rank sent forward in the output all-to-all, in whole rows: a column-wise table's
    (pooled or sequence) count once, on the feature's first column shard (`DistLayout.first_shard`),
    as do its `bags` and `unique_bags`; its bytes count on every shard at the shard's width"""

    def add(self, other: "TableCommStats") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def add_rows(self, dim: int, wire_bytes: float, elem_bytes: int, *, sent: int = 0, received: int = 0,
                 stock_sent: int = 0, stock_received: int = 0, bags: int = 0, distinct: int | None = None,
                 rows: int | None = None, whole: bool = True) -> None:
        """Count one block of rows of width `dim` (every codec dist's byte accounting).

        `sent` / `received`: rows this rank put on / took off the wire forward at
        `wire_bytes` per value (backward moves the same rows the other way);
        `stock_*`: rows the stock collective would have moved at `elem_bytes`;
        `bags`: bags this rank received pooled embeddings for. Received rows
        are the distinct bags that crossed the wire, unless `distinct` says
        otherwise (a reduce-scatter receives several partial rows per bag).
        `rows`: the rows sent as a user counts them (None: `sent`; a sequence
        column shard's part of a row is no row of its own). `whole` False: the
        block is a column shard after its feature's first (`DistLayout.first_shard`):
        its bytes count, its rows, bags and distinct bags were counted on the first.
        """
        if not whole:
            rows, bags, distinct = 0, 0, 0
        sent_bytes, recv_bytes = round(sent * dim * wire_bytes), round(received * dim * wire_bytes)
        self.rows_sent += sent if rows is None else rows
        self.payload_fwd_sent_bytes += sent_bytes
        self.payload_bwd_recv_bytes += sent_bytes
        self.payload_fwd_recv_bytes += recv_bytes
        self.payload_bwd_sent_bytes += recv_bytes
        self.unique_bags += received if distinct is None else distinct
        self.bags += bags
        self.uncompressed_fwd_sent_bytes += stock_sent * dim * elem_bytes
        self.uncompressed_fwd_recv_bytes += stock_received * dim * elem_bytes


@dataclass
class DistCommStats:
    """Counters of one codec output dist (one sharding type of one sharded EBC)."""

    codec: str
    sharding_type: str
    lossy: bool = False
    """the codec rounds what it sends (named in the summary and comm_stats.json)"""
    tables: dict[str, TableCommStats] = field(default_factory=dict)
    table_codecs: dict[str, str] = field(default_factory=dict)
    """codec per table of this all-to-all (a per-table `none` travels uncompressed)"""
    steps: int = 0
    """forward passes through this dist: training steps and evaluation batches alike"""
    codec_seconds: float = 0.0
    """unique + expand + segment-sum + index building, forward and backward (on CUDA the
    transports' part is the stream's time, comm/timing.py)"""
    transfer_seconds: float = 0.0
    """waiting for all_to_all_single, forward and backward (on CUDA: the stream's wait)"""
    extra_syncs: int = 0
    """host syncs beyond the one per step: bags longer than the learned key width"""
    fallback_steps: int = 0
    """row-wise: steps that saw a multi-id bag and ran TorchRec's reduce-scatter instead"""
    step_host_syncs: int = 0
    """host syncs on the critical path: those of plans made inside a forward (one per plan,
    two-level two, plus their `extra_syncs`); plans made ahead add none"""
    planned_ahead: int = 0
    """forward passes whose plan was made when their ids arrived (the pipeline's input stage)"""
    decisions: list[str] = field(default_factory=list)
    """`auto`: each decision with its step and reason"""
    auto_steps: tuple[int, int] | None = None
    """`auto`: (training steps from its first decision on, those of them that took dedup)"""
    hierarchy: Hierarchy = FLAT
    """what the dist runs: kind `flat` (one all-to-all over all ranks) or `node` (two levels: rails
    between nodes, then inside)"""
    messages: int = 0
    """non-empty sends to another rank, per collective, forward and backward (summed over steps)"""
    inter_node_messages: int = 0
    """of `messages`, those to a rank of another node"""
    inter_node_bytes: int = 0
    """embedding payload (forward + backward) this rank sent to ranks of other nodes"""
    intra_node_bytes: int = 0
    """embedding payload (forward + backward) this rank sent to other ranks of its node"""
    id_exchange_bytes: int = 0
    """`node`: ids (and their counts) this rank sent inside its node so that its peers can dedup"""
    ids_looked_up: int = 0
    """ids the owner's lookup took (what reached it through the input all-to-all), a column-wise
    table's once, on its first column shard"""
    rows_looked_up: int = 0
    """rows the owner's lookup gathered in whole rows (sequence: one per id; pooled: one per bag;
    a column-wise table's once, on its first column shard; row-wise: one partial sum per owner)"""
    hop_seconds: dict[str, float] = field(default_factory=dict)
    """`node`: wall time per phase of the exchange (`HOPS`), forward and backward"""
    unread_times: list[tuple[str | None, str | None, DeviceInterval]] = field(default_factory=list, repr=False)
    """CUDA times not yet read: (`codec`, `transfer` or None, hop or None, interval); `settle` adds them"""

    def add_hop(self, hop: str, seconds: float) -> None:
        self.hop_seconds[hop] = self.hop_seconds.get(hop, 0.0) + seconds

    def add_time(self, kind: str | None, seconds: Elapsed, hop: str | None = None) -> None:
        """Count `seconds` as `kind` (`codec` or `transfer`; None: neither) time, and of `hop`: a host
        time at once, a CUDA one when the stats are read (`settle`), so that no step waits for its events."""
        if isinstance(seconds, DeviceInterval):
            self.unread_times.append((kind, hop, seconds))
            if len(self.unread_times) >= _UNREAD_LIMIT:  # bounded without a sync: drop in what is done
                self._read_times(lambda t: t.done())
            return
        if kind is not None:
            setattr(self, f"{kind}_seconds", getattr(self, f"{kind}_seconds") + seconds)
        if hop is not None:
            self.add_hop(hop, seconds)

    def settle(self) -> DistCommStats:
        """Read every CUDA time into the seconds (waits for their events: call where the host syncs
        anyway, as the stats' read does); returns self."""
        self._read_times(lambda t: True)
        return self

    def _read_times(self, ready) -> None:
        unread, self.unread_times = self.unread_times, []
        for kind, hop, interval in unread:
            if ready(interval):
                self.add_time(kind, float(interval), hop)
            else:
                self.unread_times.append((kind, hop, interval))

    def count_traffic(self, traffic: list[tuple[int, int, int]], rank: int, node_of, value_bytes: float) -> None:
        """Count one step's messages: (peer, elements sent, elements received) per forward pair.

        Backward sends back what forward received, so each pair is two messages
        (when non-empty) and sent + received elements of payload from this rank.
        """
        for peer, sent, received in traffic:
            if peer == rank:
                continue  # a local copy
            n = (sent > 0) + (received > 0)
            payload = round((sent + received) * value_bytes)
            self.messages += n
            if node_of(peer) != node_of(rank):
                self.inter_node_messages += n
                self.inter_node_bytes += payload
            else:
                self.intra_node_bytes += payload

    def table(self, name: str) -> TableCommStats:
        return self.tables.setdefault(name, TableCommStats())

    def add(self, other: "DistCommStats") -> None:
        """Add the counters of `other` (one plan's, kept apart until its pass runs) to these."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name in _DESCRIPTIVE:
                continue
            if f.name == "tables":
                for name, t in theirs.items():
                    self.table(name).add(t)
            elif isinstance(mine, dict):  # e.g. seconds per phase
                for key, value in theirs.items():
                    mine[key] = mine.get(key, 0) + value
            elif isinstance(mine, list):
                mine.extend(theirs)
            else:
                setattr(self, f.name, mine + theirs)


_UNREAD_LIMIT = 256
"""unread CUDA times a dist keeps before it adds in those whose events completed (`Event.query`)"""

_DESCRIPTIVE = ("codec", "sharding_type", "lossy", "table_codecs", "hierarchy", "auto_steps")
"""`DistCommStats` fields that describe the dist rather than count (`DistCommStats.add` keeps them;
`auto_steps` is auto's own tally, read whole when its stats are asked)"""

HOPS = ("ids", "plan", "gather", "rail fwd", "intra fwd", "expand", "intra bwd", "node sum", "rail bwd", "scatter")
"""The phases of the two-level exchange timed in `DistCommStats.hop_seconds`: the node's id
exchange, the rest of the plan (uniques, the host sync, indices), the owner's gather and the
launch of the rail hop, the wait for it
(between nodes), the intra-node hop (gather, send, wait), the expand; backward: the
segment-sum and the intra-node hop back, the forwarder's sum per node-unique row and the
launch of the rail hop back, the wait for it, the owner's scatter"""

_TRAFFIC = ("messages", "inter_node_messages", "inter_node_bytes", "intra_node_bytes", "id_exchange_bytes",
            "ids_looked_up", "rows_looked_up")
"""`DistCommStats` counters of whole messages and of the lookups, summed like the table counters"""


@runtime_checkable
class CountsCommBytes(Protocol):
    """The counters of one embedding all-to-all: every codec dist, and `none`'s `StockDistCounter`."""

    def counted_bytes(self) -> DistCommStats:
        """This rank's counters so far."""
        ...


T = TypeVar("T")


class CommCounters:
    """The run's one registry of all-to-all counters (`CountsCommBytes`): the codec dists the
    sharders install, `none`'s stock counters, the lookups' counters and `auto`'s decisions at the
    source are added here as they are made, and `collect_comm_stats` reads it. Handed back by the
    sharding (distributed/sharding.py's `shard_model`); nothing is left on TorchRec's modules."""

    def __init__(self) -> None:
        self._counters: list[CountsCommBytes] = []

    def add(self, *counters: CountsCommBytes) -> None:
        self._counters.extend(counters)

    def __iter__(self) -> Iterator[CountsCommBytes]:
        return iter(list(self._counters))

    def __len__(self) -> int:
        return len(self._counters)

    def of_type(self, kind: type[T]) -> list[T]:
        """The counters that are `kind` (e.g. the `AutoDist`s), in the order they were added."""
        return [c for c in self._counters if isinstance(c, kind)]


def _sum_over_ranks(per_table: dict[str, TableCommStats], seconds: list[float],
                    group: dist.ProcessGroup | None) -> list[float]:
    """Sum the byte/bag counters over ranks in place; slowest rank's seconds. Collective."""
    names = [f.name for f in fields(TableCommStats)]
    counters = torch.tensor([[getattr(per_table[t], n) for n in names] for t in sorted(per_table)],
                            dtype=torch.float64)
    dist.all_reduce(counters, group=group)  # float64 holds byte counts exactly below 2**53
    for t, row in zip(sorted(per_table), counters.tolist()):
        for n, v in zip(names, row):
            setattr(per_table[t], n, int(v))
    times = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    return times.tolist()


@dataclass
class _Gathered:
    """Every counter of a model's all-to-alls added up (this rank's)."""

    per_table: dict[str, TableCommStats] = field(default_factory=dict)
    codec_of: dict[str, str] = field(default_factory=dict)
    lossy: set[str] = field(default_factory=set)
    steps: int = 0
    codec_s: float = 0.0
    transfer_s: float = 0.0
    extra_syncs: int = 0
    fallback_steps: int = 0
    step_syncs: int = 0
    planned_ahead: int = 0
    decisions: list[str] = field(default_factory=list)
    auto_steps: dict[str, dict[str, int]] = field(default_factory=dict)
    traffic: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_TRAFFIC, 0))
    hierarchies: set[str] = field(default_factory=set)
    hops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(HOPS, 0.0))

    def add(self, d: DistCommStats) -> None:
        d.settle()
        for hop, seconds in d.hop_seconds.items():
            self.hops[hop] += seconds
        for key in _TRAFFIC:
            self.traffic[key] += getattr(d, key)
        self.hierarchies.add(d.hierarchy.kind)
        self.decisions += [f"{d.sharding_type} {line}" for line in d.decisions]
        if d.auto_steps is not None:  # keyed as its decision lines are prefixed
            self.auto_steps[d.sharding_type] = dict(zip(("steps", "dedup"), d.auto_steps))
        for name, t in d.tables.items():
            self.per_table.setdefault(name, TableCommStats()).add(t)
            self.codec_of[name] = d.table_codecs.get(name, d.codec)
            if d.lossy and self.codec_of[name] == d.codec:
                self.lossy.add(d.codec)
        self.steps = max(self.steps, d.steps)
        self.codec_s += d.codec_seconds
        self.transfer_s += d.transfer_seconds
        self.extra_syncs += d.extra_syncs
        self.fallback_steps += d.fallback_steps
        self.step_syncs += d.step_host_syncs
        self.planned_ahead = max(self.planned_ahead, d.planned_ahead)

    def sum_over_ranks(self, group: dist.ProcessGroup | None) -> None:
        """Bytes, bags and messages summed over ranks, times the slowest rank's. Collective."""
        self.codec_s, self.transfer_s, *hop_s = _sum_over_ranks(
            self.per_table, [self.codec_s, self.transfer_s, *self.hops.values()], group)
        self.hops = dict(zip(self.hops, hop_s))
        summed = torch.tensor([self.traffic[k] for k in _TRAFFIC], dtype=torch.float64)
        dist.all_reduce(summed, group=group)
        self.traffic = {k: int(v) for k, v in zip(_TRAFFIC, summed.tolist())}

    def table_rows(self) -> dict[str, dict]:
        """Per table, its counters and ratios, in natural order (t_cat_2 before t_cat_10)."""
        rows, steps = {}, self.steps
        for name in sorted(self.per_table, key=lambda n: [int(p) if p.isdigit() else p
                                                          for p in re.split(r"(\d+)", n)]):
            t = self.per_table[name]
            row = asdict(t)
            row["codec"] = self.codec_of[name]
            row["distinct_fraction"] = t.unique_bags / t.bags if t.bags else None
            row["fwd_recv_bytes_per_pass"] = t.payload_fwd_recv_bytes / steps if steps else None
            row["payload_fwd_ratio"] = (t.uncompressed_fwd_recv_bytes / t.payload_fwd_recv_bytes
                                        if t.payload_fwd_recv_bytes and t.uncompressed_fwd_recv_bytes else None)
            rows[name] = row
        return rows


def collect_comm_stats(counters: Iterable[CountsCommBytes], all_ranks: bool = False,
                       group: dist.ProcessGroup | None = None) -> dict:
    """Per-table counters of every all-to-all `counters` hold (JSON-ready; the run's `CommCounters`).

    This rank's figures by default; with `all_ranks=True` (a collective: call
    it on every rank) bytes and bags are summed over ranks and times are the
    slowest rank's. Every all-to-all has counters, `none`'s too (stock_bytes.py,
    around TorchRec's untouched dist); a model without any gives empty `tables`.
    """
    g = _Gathered()
    for c in counters:
        g.add(c.counted_bytes())
    if all_ranks and g.per_table:
        g.sum_over_ranks(group)
    total = TableCommStats()
    for t in g.per_table.values():
        total.add(t)
    steps = g.steps
    per_step = (lambda v: v / steps if steps else None)  # noqa: E731
    return {
        "codecs": sorted(set(g.codec_of.values())),
        "auto_decisions": g.decisions,
        "auto_steps_after_probe": g.auto_steps,
        "lossy_codecs": sorted(g.lossy),
        "scope": "all ranks" if all_ranks else f"rank {dist.get_rank(group) if dist.is_initialized() else 0}",
        "steps": steps,
        "codec_seconds_per_step": g.codec_s / steps if steps else 0.0,
        "transfer_seconds_per_step": g.transfer_s / steps if steps else 0.0,
        "extra_syncs": g.extra_syncs,
        "fallback_steps": g.fallback_steps,
        # this rank's (every rank makes the same syncs): all dists together
        "host_syncs_per_step": per_step(g.step_syncs),
        "planned_ahead_steps": g.planned_ahead,
        "hierarchy": sorted(g.hierarchies),
        **{f"{k}_per_step": per_step(v) for k, v in g.traffic.items()},
        "hop_ms_per_step": {k: 1e3 * v / steps for k, v in g.hops.items() if v} if steps else {},
        # the lookups (comm/lookups.py): ids are counted where they arrive, so over all ranks
        # they are every id the input all-to-all carried; rows sent: the output all-to-all's;
        # all in whole rows (a column-wise table's ids and rows once, on its first shard)
        "ids_sent_per_step": per_step(g.traffic["ids_looked_up"]),
        "rows_sent_per_step": per_step(total.rows_sent),
        "total": asdict(total),
        "fwd_recv_bytes_per_pass": per_step(total.payload_fwd_recv_bytes),
        "payload_ratio_vs_none": (2 * total.uncompressed_fwd_recv_bytes
                                  / (total.payload_fwd_recv_bytes + total.payload_bwd_recv_bytes)
                                  if total.uncompressed_fwd_recv_bytes and
                                  total.payload_fwd_recv_bytes + total.payload_bwd_recv_bytes else None),
        "tables": g.table_rows(),
    }
