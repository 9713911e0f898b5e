"""World-size-independent embedding initialisation.

Each element of table t gets uniform(-1/sqrt(rows), 1/sqrt(rows)) (the MLPerf
references' range) from a counter-based hash of (seed, table, row, column). A
shard computes its own elements without materialising the table, and the
weights are the same for any world size or sharding type, so 1-rank and N-rank
runs start from identical models.
"""

from __future__ import annotations

import math

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

_MASK63 = (1 << 63) - 1
_CHUNK_ROWS = 1 << 16


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 64-bit integer mixer (splitmix64-style; int64 multiplication wraps)."""
    x = x ^ (x >> 31)
    x = x * -7046029254386353131  # 0x9E3779B97F4A7C15 as int64
    x = x ^ (x >> 29)
    x = x * -4658895280553007687  # 0xBF58476D1CE4E5B9 as int64
    x = x ^ (x >> 32)
    return x


def hashed_uniform(seed: int, table_index: int, num_rows: int, row_offset: int,
                   col_offset: int, out: torch.Tensor) -> None:
    """Fill `out` ([r, c] block at (row_offset, col_offset) of a table with `num_rows`
    rows) with deterministic uniform(-1/sqrt(num_rows), 1/sqrt(num_rows)) values."""
    bound = 1.0 / math.sqrt(num_rows)
    rows, cols = out.shape
    col_idx = torch.arange(col_offset, col_offset + cols, dtype=torch.int64)
    key = (seed * 1_000_003 + table_index) * 0x2545F491
    for start in range(0, rows, _CHUNK_ROWS):
        stop = min(start + _CHUNK_ROWS, rows)
        row_idx = torch.arange(row_offset + start, row_offset + stop, dtype=torch.int64)
        counter = (row_idx[:, None] << 16) + col_idx[None, :] + key
        bits = _mix(_mix(counter)) & _MASK63
        unit = (bits >> 11).to(torch.float64) / float(1 << 52)  # [0, 1)
        out[start:stop].copy_(((unit * 2.0 - 1.0) * bound).to(out.dtype))


def init_embeddings(model: torch.nn.Module, table_rows: dict[str, int], seed: int) -> int:
    """Initialise every embedding table reachable in `model.state_dict()` in place.

    Works on sharded (ShardedTensor, each local shard at its offsets) and plain
    tensors. Returns the number of tables touched on this rank.
    """
    names = sorted(table_rows)
    touched = 0
    with torch.no_grad():
        for key, value in model.state_dict().items():
            # EmbeddingBagCollection (DLRM) or EmbeddingCollection (DLRMv4) weights
            table = next((t for t in names if key.endswith((f"embedding_bags.{t}.weight",
                                                            f"embeddings.{t}.weight"))), None)
            if table is None:
                continue
            index = names.index(table)
            rows = table_rows[table]
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    r0, c0 = shard.metadata.shard_offsets
                    hashed_uniform(seed, index, rows, r0, c0, shard.tensor)
            else:
                hashed_uniform(seed, index, rows, 0, 0, value)
            touched += 1
    return touched
