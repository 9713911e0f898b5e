"""Where every id of one sequence-embedding sharding lives, as both ends of its all-to-all see it.

An unpooled (sequence) all-to-all carries one embedding row per id position.
The owner looked up the ids it received in the id all-to-all: per feature of
its KJT, the sample rank they came from and (row-wise) the id relative to its
row block. The sample rank holds its own KJT with global ids. Both ends key an
id by (rank at the other end, table, id within the owner's rows): features
that share a table share the key space, so a row needed by several features
(item_id and item_candidate_id) crosses once.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlrmtrain.comm.layout import DistLayout, Layout, RowWiseLayout


@dataclass(frozen=True)
class SequenceLayout:
    """Per-feature table indices and owners of one sequence sharding (table-wise or row-wise)."""

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

    @property
    def radix(self) -> int:
        """a bound above every id either end keys"""
        return max(self.sample_rows + self.owner_rows + [0]) + 1


def sequence_layout_of(layout: Layout, rank: int) -> SequenceLayout:
    """The sequence view of a table-wise `DistLayout` or a `RowWiseLayout` (comm/layout.py)."""
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
        return SequenceLayout(layout.world_size, dims.pop() if dims else 1, tables,
                              owner_tables=[index[e.table] for e in own],
                              owner_rows=[e.num_embeddings for e in own],
                              sample_tables=[index[e.table] for e in entries], sample_owner=owners,
                              sample_block=None, sample_rows=[e.num_embeddings for e in entries],
                              features=[e.feature for e in entries])
    # row-wise: rank r holds rows [r·block, min((r+1)·block, rows)) of every table
    owner_rows = [max(0, min(b, e.num_embeddings - rank * b)) for e, b in zip(entries, layout.block_sizes)]
    return SequenceLayout(layout.world_size, dims.pop() if dims else 1, tables,
                          owner_tables=[index[e.table] for e in own], owner_rows=owner_rows,
                          sample_tables=[index[e.table] for e in entries], sample_owner=None,
                          sample_block=list(layout.block_sizes), sample_rows=[e.num_embeddings for e in entries],
                          features=[e.feature for e in entries])
