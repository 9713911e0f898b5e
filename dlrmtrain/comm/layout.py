"""Which features each rank owns in one TorchRec embedding sharding, in wire order.

A pooled-embedding all-to-all (table-wise and column-wise sharding) carries,
from owner rank r to sample rank s, the columns of r's features in the order of
r's grouped embedding configs. Every rank can rebuild that order from the
sharding object, so codecs agree on the message layout without exchanging it.
Row-wise sharding puts every feature on every rank, rows cut into blocks of
ceil(num_embeddings / world size) (TorchRec's bucketization), so id // block
is the rank that holds it (`RowWiseLayout`).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchrec.distributed.sharding.rw_sharding import BaseRwEmbeddingSharding
from torchrec.distributed.sharding.tw_sharding import BaseTwEmbeddingSharding

from dlrmtrain.comm.torchrec_hooks import grouped_configs, grouped_configs_per_rank


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
