"""From sample arrays to per-rank torchrec `Batch`es.

Each global batch of B samples is cut into `world_size` contiguous slices of
B / world_size; rank r takes slice r. Training drops the last incomplete global
batch (as the MLPerf references do). Evaluation keeps every sample: the last
global batch is padded to equal per-rank slices with copies of a real sample
whose weight is 0, so every rank joins every all-to-all and the padding never
reaches the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from dlrmtrain.data.loader import block_to_batch, fold_ids
from dlrmtrain.data.parts import RowBlock


@dataclass
class SampleArrays:
    """A dataset held as arrays: dense [N, 13] float32 (already log-transformed),
    sparse [N, T] int64 ids, labels [N] float32."""

    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def make_batch(dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray,
               num_embeddings: list[int],
               multi_hot_offsets: Optional[list[np.ndarray]] = None) -> Batch:
    """Build one Batch; ids are folded into the model's table sizes (`id mod rows`).

    multi_hot_offsets[t] (shape [k_t]) turns one-hot id x into the fixed-size bag
    (x + offsets) mod rows: a fixed function of x, as in the MLPerf DCNv2 data.
    The KJT itself is built exactly as the file loader builds it.
    """
    block = fold_ids(RowBlock(dense, sparse, labels), num_embeddings)
    if multi_hot_offsets is not None:
        bags = [(block.sparse[:, t:t + 1] + offsets[None, :]) % rows
                for t, (offsets, rows) in enumerate(zip(multi_hot_offsets, num_embeddings))]
        block = RowBlock(block.dense, bags, block.labels)
    return block_to_batch(block)


def num_train_steps(num_samples: int, global_batch_size: int) -> int:
    """Full global batches in one pass (the incomplete last batch is dropped)."""
    return num_samples // global_batch_size


def train_batches(arrays: SampleArrays, global_batch_size: int, rank: int, world_size: int,
                  num_embeddings: list[int], epoch_seed: Optional[int],
                  multi_hot_offsets: Optional[list[np.ndarray]] = None,
                  start_step: int = 0) -> Iterator[Batch]:
    """This rank's slices of each full global batch from `start_step` on; shuffled
    when epoch_seed is set."""
    n = len(arrays)
    order = (np.random.default_rng(epoch_seed).permutation(n) if epoch_seed is not None
             else np.arange(n))
    local = global_batch_size // world_size
    for step in range(start_step, num_train_steps(n, global_batch_size)):
        start = step * global_batch_size + rank * local
        idx = order[start:start + local]
        yield make_batch(arrays.dense[idx], arrays.sparse[idx], arrays.labels[idx],
                         num_embeddings, multi_hot_offsets)


def eval_batches(arrays: SampleArrays, global_batch_size: int, rank: int, world_size: int,
                 num_embeddings: list[int],
                 multi_hot_offsets: Optional[list[np.ndarray]] = None,
                 ) -> Iterator[tuple[Batch, torch.Tensor]]:
    """Every sample exactly once over all ranks, as (batch, weight) with weight 0 on padding."""
    n = len(arrays)
    for start in range(0, n, global_batch_size):
        stop = min(start + global_batch_size, n)
        local = -(-(stop - start) // world_size)  # ceil: equal slices, last one padded
        lo = min(start + rank * local, stop)
        hi = min(lo + local, stop)
        idx = np.arange(lo, hi)
        weight = torch.ones(local)
        if len(idx) < local:
            weight[len(idx):] = 0.0
            idx = np.concatenate([idx, np.full(local - len(idx), start)])
        yield make_batch(arrays.dense[idx], arrays.sparse[idx], arrays.labels[idx],
                         num_embeddings, multi_hot_offsets), weight
