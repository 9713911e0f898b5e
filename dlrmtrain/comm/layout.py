"""Which features each rank owns in one TorchRec embedding sharding, in wire order.

A pooled-embedding all-to-all (table-wise and column-wise sharding) carries,
from owner rank r to sample rank s, the columns of r's features in the order of
r's grouped embedding configs. Every rank can rebuild that order from the
sharding object, so codecs agree on the message layout without exchanging it.
Row-wise sharding puts every feature on every rank, rows cut into blocks of
ceil(num_embeddings / world size) (TorchRec's bucketization), so id // block
is the rank that holds it (`RowWiseLayout`).

A sequence (EmbeddingCollection) all-to-all's view of the same shardings is
`SequenceLayout` (`sequence_layout_of`), at the end of this module; a column-wise sequence
sharding is table-wise over its column shards, each an entry of width dim / shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from torchrec.distributed.sharding.rw_sharding import BaseRwEmbeddingSharding
from torchrec.distributed.sharding.tw_sharding import BaseTwEmbeddingSharding

from dlrmtrain.comm.torchrec.sharded import grouped_configs, grouped_configs_per_rank


@dataclass(frozen=True)
class FeatureEntry:
    """One feature's column block (a whole table, or one column shard of it)."""

    feature: str
    table: str
    dim: int
    num_embeddings: int


@dataclass(frozen=True)
class DistLayout:
    """Feature entries per owner rank, in the order their columns travel."""

    entries_per_rank: list[list[FeatureEntry]]

    @property
    def world_size(self) -> int:
        return len(self.entries_per_rank)

    def dim_sum(self, rank: int) -> int:
        return sum(e.dim for e in self.entries_per_rank[rank])

    def all_entries(self) -> list[FeatureEntry]:
        """Entries of all ranks, rank-major: the receiver's feature order."""
        return [e for entries in self.entries_per_rank for e in entries]

    @cached_property
    def first_shard(self) -> list[list[bool]]:
        """Per owner rank, per entry: whether it is its feature's first column shard (rank-major).
        A column-wise table counts its rows, bags and lookups there, once, in whole rows; its bytes
        on every shard (table-wise: every entry is its feature's first)."""
        entries = self.all_entries()
        flags = iter(_first_shards(entries) or [True] * len(entries))
        return [[next(flags) for _ in per_rank] for per_rank in self.entries_per_rank]

    def all_first_shard(self) -> list[bool]:
        """`first_shard` of `all_entries`, rank-major (the receiver's feature order)."""
        return [f for per_rank in self.first_shard for f in per_rank]


def layout_of(sharding: BaseTwEmbeddingSharding) -> DistLayout:
    """Read the per-rank feature order from a table-/column-wise sharding."""
    per_rank: list[list[FeatureEntry]] = []
    for rank_configs in grouped_configs_per_rank(sharding):
        entries = [
            FeatureEntry(feature, table.name, table.local_cols, table.num_embeddings)
            for config in rank_configs
            for table in config.embedding_tables
            for feature in table.feature_names
        ]
        per_rank.append(entries)
    return DistLayout(per_rank)


@dataclass(frozen=True)
class RowWiseLayout:
    """Row-wise sharding: every rank holds rows [r·block, (r+1)·block) of every feature's table."""

    entries: list[FeatureEntry]
    """features in the order of the pooled output's columns"""
    block_sizes: list[int]
    """rows per rank, per entry"""
    world_size: int


def row_wise_layout_of(sharding: BaseRwEmbeddingSharding, world_size: int) -> RowWiseLayout:
    entries = [
        FeatureEntry(feature, table.name, table.embedding_dim, table.num_embeddings)
        for config in grouped_configs(sharding)
        for table in config.embedding_tables
        for feature in table.feature_names
    ]
    # the same block size RwSparseFeaturesDist bucketizes ids with
    blocks = [(e.num_embeddings + world_size - 1) // world_size for e in entries]
    return RowWiseLayout(entries, blocks, world_size)


Layout = DistLayout | RowWiseLayout
"""what a codec is given: the wire layout of one sharding's all-to-all"""


def layout_for(sharding_type: str, sharding, world_size: int) -> Layout | None:
    """The wire layout of one sharding's output dist; None for sharding types without one."""
    if sharding_type == "row_wise":
        return row_wise_layout_of(sharding, world_size)
    if sharding_type in ("table_wise", "column_wise", "table_column_wise"):
        return layout_of(sharding)
    return None


# --- sequence embeddings: where every id of one sequence sharding lives, as both ends
# of its all-to-all see it.
#
# An unpooled (sequence) all-to-all carries one embedding row per id position.
# The owner looked up the ids it received in the id all-to-all: per feature of
# its KJT, the sample rank they came from and (row-wise) the id relative to its
# row block. The sample rank holds its own KJT with global ids. Both ends key an
# id by (rank at the other end, table, id within the owner's rows): features
# that share a table share the key space, so a row needed by several features
# (item_id and item_candidate_id) crosses once.


@dataclass(frozen=True)
class SequenceLayout:
    """Per-feature table indices and owners of one sequence sharding (table-, column- or row-wise).

    Column-wise is table-wise over the column shards: each shard's features are entries of their
    own (`dim` the shard's width), so one feature appears once per shard."""

    world_size: int
    dim: int
    """embedding dim of every table (an EmbeddingCollection has one)"""
    tables: list[str]
    """the sharding's tables, sorted: a table's index is its place here, the same on every rank"""
    owner_tables: list[int]
    """per feature of the owner's KJT (this rank's features), its table index"""
    owner_rows: list[int]
    """per feature of the owner's KJT, the rows this rank holds of its table (ids must lie below)"""
    sample_tables: list[int]
    """per feature of the sample rank's KJT, its table index"""
    sample_owner: list[int] | None
    """table-wise: per sample feature, the rank that owns its table; None for row-wise"""
    sample_block: list[int] | None
    """row-wise: per sample feature, the rows per rank block (id // block is the owner); None for table-wise"""
    sample_rows: list[int]
    """per sample feature, its table's rows"""
    features: list[str]
    """the sample rank's features in KJT order (for error messages)"""
    owner_first_shard: list[bool] | None = None
    """column-wise: per owner feature, whether it is the feature's first column shard (rank-major):
    a position's id, lookup and row count there, once; None: every feature is (table-/row-wise)"""
    sample_first_shard: list[bool] | None = None
    """per sample feature, the same"""

    @property
    def radix(self) -> int:
        """a bound above every id either end keys"""
        return max(self.sample_rows + self.owner_rows + [0]) + 1


def sequence_layout_of(layout: Layout, rank: int) -> SequenceLayout:
    """The sequence view of a table-/column-wise `DistLayout` or a `RowWiseLayout`."""
    if isinstance(layout, DistLayout):
        entries = layout.all_entries()
        own = layout.entries_per_rank[rank]
    elif isinstance(layout, RowWiseLayout):
        entries = own = layout.entries
    else:
        raise TypeError(f"no sequence layout for {type(layout).__name__}")
    dims = {e.dim for e in entries}
    if len(dims) > 1:
        raise ValueError(f"sequence embeddings of one sharding have different dims {sorted(dims)}")
    tables = sorted({e.table for e in entries})
    index = {t: i for i, t in enumerate(tables)}
    if isinstance(layout, DistLayout):
        owners = [r for r, per_rank in enumerate(layout.entries_per_rank) for _ in per_rank]
        first = _first_shards(entries)
        return SequenceLayout(layout.world_size, dims.pop() if dims else 1, tables,
                              owner_tables=[index[e.table] for e in own],
                              owner_rows=[e.num_embeddings for e in own],
                              sample_tables=[index[e.table] for e in entries], sample_owner=owners,
                              sample_block=None, sample_rows=[e.num_embeddings for e in entries],
                              features=[e.feature for e in entries],
                              owner_first_shard=None if first is None else
                              [f for f, o in zip(first, owners, strict=True) if o == rank],
                              sample_first_shard=first)
    # row-wise: rank r holds rows [r·block, min((r+1)·block, rows)) of every table
    owner_rows = [max(0, min(b, e.num_embeddings - rank * b)) for e, b in zip(entries, layout.block_sizes)]
    return SequenceLayout(layout.world_size, dims.pop() if dims else 1, tables,
                          owner_tables=[index[e.table] for e in own], owner_rows=owner_rows,
                          sample_tables=[index[e.table] for e in entries], sample_owner=None,
                          sample_block=list(layout.block_sizes), sample_rows=[e.num_embeddings for e in entries],
                          features=[e.feature for e in entries])


def _first_shards(entries: list[FeatureEntry]) -> list[bool] | None:
    """Per entry, whether it is its feature's first (a column-wise feature has one entry per
    column shard); None where every feature has one entry."""
    seen: set[str] = set()
    out = []
    for e in entries:
        out.append(e.feature not in seen)
        seen.add(e.feature)
    return None if all(out) else out
