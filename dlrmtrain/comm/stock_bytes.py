"""What TorchRec's stock output dist moves, counted from the wire layout and the batch sizes.

Codec `none` keeps TorchRec's dist untouched; these counters only read the
layout and the step's batch sizes, so `none` (and `auto` on its `none`
path) report the same per-table bytes as `dedup`'s `uncompressed_*` figures.

A sequence all-to-all (TorchRec's `SequenceEmbeddingsAllToAll`) moves one row
per id position instead: `SequenceStockCounter`, at the end of this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

from dlrmtrain.comm.torchrec import pooled, sequence, sharded
from dlrmtrain.comm.dedup.sequence_source import DEDUPED_SHARDING_TYPES
from dlrmtrain.comm.layout import (
    DistLayout, Layout, RowWiseLayout, SequenceLayout, layout_for, sequence_layout_of)
from dlrmtrain.comm.stats import CommCounters, CountsCommBytes, DistCommStats


def count_stock_step(stats: DistCommStats, layout: Layout, rank: int, sizes: list[int], elem: int,
                     wire: float | None = None) -> None:
    """Add one pass of the stock dist (batch `sizes` per sample rank, `elem`-byte values) to `stats`;
    `wire`: bytes per value on the wire where TorchRec's qcomms quantize them (codecs/lossy.py),
    else `elem`."""
    W = layout.world_size
    B = sizes[rank]
    wire = elem if wire is None else wire
    if isinstance(layout, DistLayout):  # a column-wise table's rows count on its first shard
        for entry, whole in zip(layout.entries_per_rank[rank], layout.first_shard[rank], strict=True):
            for n in sizes:
                stats.table(entry.table).add_rows(entry.dim, wire, elem, sent=n, stock_sent=n, whole=whole)
        for entry, whole in zip(layout.all_entries(), layout.all_first_shard(), strict=True):
            stats.table(entry.table).add_rows(entry.dim, wire, elem, received=B, stock_received=B, bags=B,
                                              whole=whole)
    elif isinstance(layout, RowWiseLayout):
        # the reduce-scatter: partial sums of every sample rank's bags out, W partial sums of its own in
        for entry in layout.entries:
            t = stats.table(entry.table)
            for n in sizes:
                t.add_rows(entry.dim, wire, elem, sent=n, stock_sent=n)
            t.add_rows(entry.dim, wire, elem, received=W * B, stock_received=W * B, bags=B, distinct=B)
    stats.steps += 1


def count_stock_vbe_step(stats: DistCommStats, layout: Layout, rank: int, sizes_per_rank_per_feature: list[list[int]],
                         own_sizes: list[int], elem: int) -> None:
    """Add one variable-batch pass (dedup at the source) of the stock dist to `stats`: rows per
    (sample rank, owner feature) in the owner's feature order (TorchRec's `batch_size_per_rank_per_feature`,
    the layout's order), and this rank's rows per feature of the sharding (`batch_size_per_feature_pre_a2a`,
    rank-major: `DistLayout.all_entries`). The full batch is not in the dist's context: the uncompressed figures
    (and the bags) are left uncounted (0: the summary shows no ratio); a `none` run gives them, and
    comm/lookups.py counts what was sent and looked up. Row-wise: each feature's partial sums go
    to every sample rank, `sizes_per_rank_per_feature[s][j]` rows to rank s, in the layout's order."""
    if isinstance(layout, DistLayout):
        for j, (entry, whole) in enumerate(zip(layout.entries_per_rank[rank], layout.first_shard[rank], strict=True)):
            for per_feature in sizes_per_rank_per_feature:
                stats.table(entry.table).add_rows(entry.dim, elem, elem, sent=per_feature[j], whole=whole)
        for entry, n, whole in zip(layout.all_entries(), own_sizes, layout.all_first_shard(), strict=True):
            stats.table(entry.table).add_rows(entry.dim, elem, elem, received=n, whole=whole)  # bags: the full batch's
        stats.steps += 1
    else:  # row-wise, per feature: deduplicated features differ in their distinct bags
        for j, entry in enumerate(layout.entries):
            t = stats.table(entry.table)
            for per_feature in sizes_per_rank_per_feature:
                t.add_rows(entry.dim, elem, elem, sent=per_feature[j])
            t.add_rows(entry.dim, elem, elem, received=layout.world_size * own_sizes[j], distinct=own_sizes[j])
        stats.steps += 1


PassKey = tuple[tuple[int, ...], int, int]
"""One stock pass as tallied: (the context's batch sizes per sample rank, or () when it
has none; the rows of the local embeddings; their element size)."""


def pass_key(local_embs: torch.Tensor, sharding_ctx) -> PassKey:
    """What counting one stock pass needs, read without touching the values (no sync)."""
    return (tuple(getattr(sharding_ctx, "batch_size_per_rank", None) or ()),
            local_embs.shape[0], local_embs.element_size())


def add_tallied_passes(stats: DistCommStats, layout: Layout, rank: int,
                       tally: dict[PassKey, int]) -> None:
    """Add `tally` (pass key → passes) to `stats`: each distinct pass counted once, times its
    tally. Every counter is linear in the passes, so this equals counting them one by one."""
    W = layout.world_size
    for (sizes, rows, elem), n in tally.items():
        one = DistCommStats(codec=stats.codec, sharding_type=stats.sharding_type)
        count_stock_step(one, layout, rank, list(sizes) or [rows // W] * W, elem)
        for name, t in one.tables.items():
            dst = stats.table(name)
            for f in dataclasses.fields(t):
                setattr(dst, f.name, getattr(dst, f.name) + n * getattr(t, f.name))
        stats.steps += n


class StockDistCounter:
    """Counts one stock output dist's passes; a forward pre-hook, so the dist itself is unchanged.

    The hook only tallies the pass (a dict increment, ~1 µs); the bytes are counted when
    the stats are read, once per distinct batch shape (counting every pass per table cost
    ~90 µs a step at 26 tables)."""

    def __init__(self, layout: Layout, rank: int, sharding_type: str, codec: str = "none") -> None:
        self.layout, self.rank = layout, rank
        tables = [e.table for e in (layout.all_entries() if isinstance(layout, DistLayout) else layout.entries)]
        self._counted = DistCommStats(codec=codec, sharding_type=sharding_type,
                                      table_codecs={t: codec for t in tables})
        self._tally: dict[PassKey, int] = {}

    def __call__(self, _module: nn.Module, args: tuple) -> None:
        sharding_ctx = args[1] if len(args) > 1 else None
        if getattr(sharding_ctx, "variable_batch_per_feature", False):  # host lists: counted now
            count_stock_vbe_step(self._counted, self.layout, self.rank, sharding_ctx.batch_size_per_rank_per_feature,
                                 sharding_ctx.batch_size_per_feature_pre_a2a, args[0].element_size())
            return
        key = pass_key(args[0], sharding_ctx)
        self._tally[key] = self._tally.get(key, 0) + 1

    @property
    def comm_stats(self) -> DistCommStats:
        """The passes so far, counted."""
        add_tallied_passes(self._counted, self.layout, self.rank, self._tally)
        self._tally = {}
        return self._counted

    @comm_stats.setter
    def comm_stats(self, value: DistCommStats) -> None:
        """Restart the counters from `value` (tests count training steps only)."""
        self._tally = {}
        self._counted = value

    def counted_bytes(self) -> DistCommStats:
        """`stats.CountsCommBytes`"""
        return self.comm_stats


def count_stock_dists(model: nn.Module, counters: CommCounters, codec: str = "none") -> int:
    """Attach a `StockDistCounter` to every stock output dist left in `model` (codec `none`; under
    dedup at the source the stock dists carry `dedup`, and `codec` says so).

    Codec dists count themselves; the counters join them in the run's `counters`, which
    `collect_comm_stats` reads. Returns how many were attached.
    """
    def counter_for(m: nn.Module, env, sharding_type: str, sharding) -> StockDistCounter | None:
        layout = layout_for(sharding_type, sharding, env.world_size)
        if layout is None:
            return None
        return StockDistCounter(layout, dist.get_rank(env.process_group), sharding_type, codec)

    return _attach_stock_counters(model, counters, ShardedEmbeddingBagCollection, pooled.shardings, counter_for)


def _attach_stock_counters(model: nn.Module, counters: CommCounters, module_type: type,
                           shardings_of: Callable[[nn.Module], list], counter_for: Callable) -> int:
    """Hook `counter_for(module, env, sharding_type, sharding)` (None: not counted) onto each stock output
    dist of every `module_type` in `model`, and add the counters to the run's `counters`; both
    collection kinds attach their counters so. Returns how many."""
    attached = 0
    for m in model.modules():
        if not isinstance(m, module_type):
            continue
        env = sharded.sharding_env(m)
        for (sharding_type, sharding), out_dist in zip(shardings_of(m), sharded.output_dists(m)):
            if isinstance(out_dist, CountsCommBytes) or sharded.qcomm_codecs(out_dist) is not None:
                continue  # counted by the codec, or quantized by TorchRec's qcomms
            counter = counter_for(m, env, sharding_type, sharding)
            if counter is not None:
                out_dist.register_forward_pre_hook(counter)
                counters.add(counter)
                attached += 1
    return attached


# --- sequence embeddings: one row per id position, per table.
#
# `none` keeps TorchRec's `SequenceEmbeddingsAllToAll` untouched; a forward
# pre-hook sums each step's positions per feature on the device (from the lengths
# both ends hold) and the sums are read back only with the counters, so counting
# adds no host sync. `auto`'s `none` path (auto/sequence.py) counts the same way.
# A column-wise sharding is table-wise over its column shards (`SequenceLayout`):
# each shard moves its own width per position, so the bytes are every shard's,
# while ids, lookups and rows count once per position of the table, on the
# feature's first shard: a user reads one row of the full dim per position.


COUNTED_SHARDING_TYPES = ("table_wise", "column_wise", "row_wise")


def _per_feature(lengths: torch.Tensor, features: int) -> torch.Tensor:
    """Positions per feature of feature-major `lengths` (int64, on their device)."""
    if not features:
        return torch.zeros(0, dtype=torch.int64, device=lengths.device)
    return lengths.reshape(features, -1).sum(1).to(torch.int64)


def _per_table(counts: list[int], tables: list[int], first_shard: list[bool] | None, n: int
               ) -> tuple[list[int], list[int]]:
    """Per table: (the positions of all its column shards, those of its first shard only)."""
    all_shards, first = [0] * n, [0] * n
    for count, t, is_first in zip(counts, tables, first_shard or [True] * len(tables), strict=True):
        all_shards[t] += count
        first[t] += count if is_first else 0
    return all_shards, first


class SequenceStockCounter:
    """Positions per feature of one sequence all-to-all, summed on the device."""

    def __init__(self, layout: SequenceLayout, sharding_type: str, codec: str = "none") -> None:
        self.layout = layout
        self.elem_bytes = 4
        self.stats = DistCommStats(codec=codec, sharding_type=sharding_type,
                                   table_codecs={t: codec for t in layout.tables})
        self._sums: list[torch.Tensor] | None = None
        """per owner feature the rows this rank sends (as owner); per sample feature the rows it
        receives (as sample rank), and its positions (before dedup at the source)"""

    def count(self, sharding_ctx, elem_bytes: int) -> None:
        """Add one pass (TorchRec's sharding context holds both ends' lengths)."""
        owner_lengths, sample_lengths = sequence.sequence_lengths_of_both_ends(sharding_ctx)
        lay = self.layout
        # at the source sample_lengths are the distinct ids'; `auto` there mixes both forms' steps
        source = sequence.source_lengths(sharding_ctx)
        sums = [_per_feature(owner_lengths, len(lay.owner_tables)),
                _per_feature(sample_lengths, len(lay.sample_tables)),
                _per_feature(sample_lengths if source is None else source, len(lay.sample_tables))]
        if self._sums is None:
            self._sums = sums
        else:
            for acc, add in zip(self._sums, sums):
                acc.add_(add)
        self.elem_bytes = elem_bytes
        self.stats.steps += 1

    def flush(self) -> DistCommStats:
        """The counters, with the positions summed so far added (a host read: only when read)."""
        if self._sums is not None:
            lay, T = self.layout, len(self.layout.tables)
            sent, received, positions = (s.tolist() for s in self._sums)
            sent, sent_rows = _per_table(sent, lay.owner_tables, lay.owner_first_shard, T)
            received, received_rows = _per_table(received, lay.sample_tables, lay.sample_first_shard, T)
            positions, position_rows = _per_table(positions, lay.sample_tables, lay.sample_first_shard, T)
            self.stats.ids_looked_up += sum(sent_rows)  # the owner looks up one row per id it got
            self.stats.rows_looked_up += sum(sent_rows)
            # positions: what `none` would move (at the source the owner sees only the distinct
            # ids: its stock_sent stays what it sent); bytes at the shards' width, rows whole
            for t, name in enumerate(lay.tables):
                self.stats.table(name).add_rows(lay.dim, self.elem_bytes, self.elem_bytes, sent=sent[t],
                                                received=received[t], stock_sent=sent[t],
                                                stock_received=positions[t], bags=position_rows[t],
                                                distinct=received_rows[t], rows=sent_rows[t])
            self._sums = None
        return self.stats

    def __call__(self, _module: nn.Module, args: tuple) -> None:
        """Forward pre-hook on the stock dist: (local_embs, sharding_ctx)."""
        self.count(args[1], args[0].element_size())

    def counted_bytes(self) -> DistCommStats:
        """`stats.CountsCommBytes`"""
        return self.flush()


def count_sequence_stock_dists(model: nn.Module, counters: CommCounters, codec: str = "none") -> int:
    """Attach a `SequenceStockCounter` to every table-, column- and row-wise stock sequence dist in `model`.

    Codec dists count themselves; the counters join them in the run's `counters`. TorchRec's qcomms are not counted. At the source (`codec`
    given) only table- and row-wise ids are deduplicated: column-wise tables travel
    whole and are counted as `none`. Returns how many were attached.
    """
    def counter_for(m: nn.Module, env, sharding_type: str, sharding) -> SequenceStockCounter | None:
        if sharding_type not in COUNTED_SHARDING_TYPES:
            return None
        layout = sequence_layout_of(layout_for(sharding_type, sharding, env.world_size),
                                    dist.get_rank(env.process_group))
        # dedup at the source (the sample side) is codec dedup (or auto's two forms) through the stock dist
        deduped = sequence.dedups_at_source(m) and sharding_type in DEDUPED_SHARDING_TYPES
        return SequenceStockCounter(layout, sharding_type, codec if deduped else "none")

    return _attach_stock_counters(model, counters, ShardedEmbeddingCollection, sequence.ec_shardings, counter_for)
