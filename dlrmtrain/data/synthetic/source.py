"""Data source `synthetic`: generated samples read by the same loader as files on disk.

The train and eval sets are generated in memory (every rank the same arrays from the
same seeds) and exposed as Parts, so per-rank slicing, the last-batch policies
(train drops, eval pads with weight 0), id folding, the KJT build and the shuffle rule
are the file loader's (loader.py). Shuffle: the order of the full global batches is
permuted per (run.seed, epoch), always on: generated rows have no order worth keeping.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from dlrmtrain.config.schema import Config
from dlrmtrain.data.loader import CriteoBatchLoader, CriteoLoaderSpec
from dlrmtrain.data.parts import RowBlock
from dlrmtrain.data.synthetic.generator import generate, multi_hot_offsets


class GeneratedPart:
    """Generated rows held in memory, as a Part.

    With `bag_offsets`, table t's one-hot id x becomes the fixed-size bag
    (x + bag_offsets[t]) mod rows[t]: a fixed function of x, as in the MLPerf DCNv2 data.
    """

    def __init__(self, name: str, block: RowBlock, table_rows: Sequence[int],
                 bag_offsets: Optional[list[np.ndarray]] = None) -> None:
        self.name, self.block, self.rows = name, block, len(block)
        self.table_rows, self.bag_offsets = list(table_rows), bag_offsets

    def read(self, start: int, stop: int) -> RowBlock:
        b = self.block
        sparse = b.sparse[start:stop]
        if self.bag_offsets is not None:
            sparse = [(sparse[:, t:t + 1] + offsets[None, :]) % rows
                      for t, (offsets, rows) in enumerate(zip(self.bag_offsets, self.table_rows))]
        return RowBlock(b.dense[start:stop], sparse, b.labels[start:stop])


def build_synthetic_loaders(
    cfg: Config, rank: int, world_size: int, model_rows: list[int],
) -> tuple[CriteoBatchLoader, CriteoBatchLoader]:
    """(train loader, eval loader) for this rank."""
    data, seed = cfg.data, cfg.run.seed
    offsets = None
    if data.multi_hot_sizes is not None:
        offsets = multi_hot_offsets(model_rows, data.multi_hot_sizes, seed + 7)
    train = GeneratedPart("synthetic_train", generate(data, data.synthetic.num_train_samples, seed + 1),
                          model_rows, offsets)
    evals = GeneratedPart("synthetic_eval", generate(data, data.synthetic.num_eval_samples, seed + 2),
                          model_rows, offsets)
    # In memory: nothing to read ahead, so no prefetch thread.
    common = dict(rank=rank, world_size=world_size, prefetch=0, fold_to_rows=model_rows)
    return (CriteoBatchLoader([train], CriteoLoaderSpec(cfg.run.global_batch_size, shuffle=True,
                                                        seed=seed, last_batch="drop", **common)),
            CriteoBatchLoader([evals], CriteoLoaderSpec(cfg.eval.batch_size, last_batch="pad", **common)))
