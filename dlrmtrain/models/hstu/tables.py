"""The DLRMv4 embedding tables: one unpooled (sequence) table per entry of
`sequence_features.TABLES`, shared by the history and candidate features that name
it, as a TorchRec EmbeddingCollection (so DistributedModelParallel can shard it).

Rows are the reference's, capped at `model.max_table_rows` for scaled runs (the data
folds ids into the capped table). Init: uniform ±sqrt(1 / rows), TorchRec's default
and the reference's.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection

from dlrmtrain.sequence_features import TABLES


def hstu_table_rows(max_table_rows: Optional[int]) -> dict[str, int]:
    """Table → rows in this run: the reference's, capped at `max_table_rows`."""
    return {name: rows if max_table_rows is None else min(rows, max_table_rows)
            for name, (rows, _features) in TABLES.items()}


def embedding_configs(rows: dict[str, int], dim: int) -> list[EmbeddingConfig]:
    return [EmbeddingConfig(name=name, num_embeddings=rows[name], embedding_dim=dim,
                            feature_names=list(features))
            for name, (_full_rows, features) in TABLES.items()]


def embedding_collection(rows: dict[str, int], dim: int, device: torch.device
                         ) -> EmbeddingCollection:
    """On `meta` (the default for training) DMP materialises each rank's shards; on a
    real device the tables are initialised here."""
    ec = EmbeddingCollection(tables=embedding_configs(rows, dim), need_indices=False,
                             device=device)
    if device.type != "meta":
        with torch.no_grad():
            for name, weight in ec.embeddings.items():
                bound = math.sqrt(1.0 / rows[name])
                weight.weight.uniform_(-bound, bound)
    return ec
