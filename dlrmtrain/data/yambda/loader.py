"""Ordered samples → this rank's `SequenceBatch`es: rank slices, last-batch policy, resumption.

The samples come as windows (lists of sample ids in streaming order, fetched one at a
time: `Windows`; the synthetic source has one window). Each window is cut into global batches of
`global_batch_size` consecutive samples; a rank's share of a global batch is
- `round_robin`: every world_size-th sample from its rank (the reference's
  StreamingWindowSampler / DistributedSampler: all ranks on the same time front), or
- `contiguous`: the rank's block of global_batch_size / world_size samples (the Criteo
  loader's rule; with user-major samples a rank batch then spans as few users as the
  data allows, so in-batch unique rates do not depend on the world size).

Last-batch policy: `drop` (train): a window's partial global batch is not yielded, as the
reference (drop_last per window); `pad` (eval): it is, every rank taking ceil(R / W)
slots filled past the data with copies of the remainder's first sample at weight 0, so
every sample counts exactly once. Batch positions count across windows; `batches_from(k)`
yields exactly the tail of a full pass from position k, on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Sequence

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.data.prefetch import Prefetcher
from dlrmtrain.data.yambda.batch import SampleColumns, to_sequence_batch
from dlrmtrain.sequence_features import SequenceBatch

RankSlicing = Literal["round_robin", "contiguous"]
LastBatch = Literal["drop", "pad"]


@dataclass
class Windows:
    """Windows fetched on demand (a 5b training pass holds ~2.3 G sample ids: never all at once)."""

    sizes: list[int]
    """Samples per window."""
    get: Callable[[int], np.ndarray]
    """Window number → its sample ids in streaming order (len == sizes[w])."""

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray]) -> "Windows":
        arrays = [np.asarray(a, dtype=np.int64) for a in arrays]
        return cls([len(a) for a in arrays], arrays.__getitem__)


@dataclass(frozen=True)
class SequenceLoaderSpec:
    """What one rank's SequenceBatchLoader cuts from the windows, and how it makes the batches."""

    rank: int
    world_size: int
    global_batch_size: int
    slicing: RankSlicing = "round_robin"
    last_batch: LastBatch = "drop"
    prefetch: int = 0
    """Batches made ahead on background threads (0: made where they are read)."""
    workers: int = 1
    """Threads making those batches, each a whole batch and its transform at a time (data.workers)."""
    pin_memory: bool = False
    """Pinned batches for a GPU (data.loader.pins_for), built on the prefetch thread."""


class SequenceBatchLoader:
    def __init__(self, windows: Windows | Sequence[np.ndarray], make_columns: Callable[[np.ndarray], SampleColumns],
                 spec: SequenceLoaderSpec) -> None:
        rank, world_size, global_batch_size = spec.rank, spec.world_size, spec.global_batch_size
        if global_batch_size % world_size:
            raise ValueError(f"global batch {global_batch_size} does not divide by the world size {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.windows = windows if isinstance(windows, Windows) else Windows.of(windows)
        self.make_columns, self.rank, self.world = make_columns, rank, world_size
        self.global_batch, self.local_batch = global_batch_size, global_batch_size // world_size
        self.slicing, self.last_batch, self.prefetch = spec.slicing, spec.last_batch, spec.prefetch
        self.workers = spec.workers
        self.pin_memory = spec.pin_memory  # set by build_datasets from the device
        self.sparse_transform: Callable[[KeyedJaggedTensor], KeyedJaggedTensor] | None = None
        """applied to each batch's `sparse` KJT where the batch is made (dedup at the source)"""
        self.keep_full_batch = False
        """True: the transform's KJT goes beside the full one (`SequenceBatch.distinct_sparse`:
        comm.codec auto at the source)"""
        last_batch = spec.last_batch
        per_window = [n // global_batch_size if last_batch == "drop" else -(-n // global_batch_size)
                      for n in self.windows.sizes]
        self._first_batch = np.concatenate([[0], np.cumsum(per_window)]).astype(np.int64)
        self.num_samples = int(sum(self.windows.sizes))
        self._cached: tuple[int, np.ndarray] = (-1, np.zeros(0, np.int64))

    def _window(self, w: int) -> np.ndarray:
        cached = self._cached  # read once: workers may replace it meanwhile
        if cached[0] == w:  # batches walk the windows in order: one window held at a time
            return cached[1]
        ids = np.asarray(self.windows.get(w), dtype=np.int64)
        if len(ids) != self.windows.sizes[w]:
            raise RuntimeError(f"window {w}: {len(ids)} samples, {self.windows.sizes[w]} announced")
        self._cached = (w, ids)
        return ids

    @property
    def num_batches(self) -> int:
        return int(self._first_batch[-1])

    @property
    def num_real_samples(self) -> int:
        """Samples a full pass yields over all ranks (train: the dropped remainders excluded;
        eval: every sample once), e.g. MLPerf's train / eval sample counts."""
        if self.last_batch == "pad":
            return self.num_samples
        return self.num_batches * self.global_batch

    def rank_sample_ids(self, position: int) -> tuple[np.ndarray, int]:
        """(sample ids of this rank's batch at `position`, how many of them are real; the rest pad)."""
        if not 0 <= position < self.num_batches:
            raise IndexError(f"batch {position} outside 0..{self.num_batches - 1}")
        w = int(np.searchsorted(self._first_batch, position, side="right") - 1)
        j = position - int(self._first_batch[w])
        part = self._window(w)[j * self.global_batch:(j + 1) * self.global_batch]
        if self.slicing == "round_robin":
            mine = part[self.rank::self.world]
        else:
            share = -(-len(part) // self.world)
            mine = part[self.rank * share:(self.rank + 1) * share]
        slots = -(-len(part) // self.world)
        real = len(mine)
        if real < slots:  # a padded final batch; ranks past the data repeat the remainder's first sample
            mine = np.concatenate([mine, np.full(slots - real, part[0], dtype=np.int64)])
        return mine, real

    def _batch(self, position: int) -> tuple[SequenceBatch, torch.Tensor]:
        ids, real = self.rank_sample_ids(position)
        weights = torch.zeros(len(ids), dtype=torch.float32)
        weights[:real] = 1.0
        batch = to_sequence_batch(self.make_columns(ids))
        if self.sparse_transform is not None:  # here: the prefetch thread, off the step's
            made = self.sparse_transform(batch.sparse)
            batch = (SequenceBatch(batch.uih, batch.candidates, batch.sparse, made) if self.keep_full_batch
                     else SequenceBatch(batch.uih, batch.candidates, made))
        if self.pin_memory:
            return batch.pin_memory(), weights.pin_memory()
        return batch, weights

    def _weighted_from(self, start: int) -> Iterator[tuple[SequenceBatch, torch.Tensor]]:
        positions = range(start, self.num_batches)
        if self.prefetch <= 0:
            for p in positions:
                yield self._batch(p)
            return
        # Build batches ahead on `workers` threads (numpy, the KJT build and the transform release
        # the GIL for most of it), handed over in order.
        with Prefetcher(self._batch, positions, self.prefetch, name="yambda-prefetch", workers=self.workers) as made:
            yield from made

    def batches_from(self, start: int = 0) -> Iterator[SequenceBatch]:
        """This rank's batches from global batch position `start` to the end."""
        for batch, _w in self._weighted_from(start):
            yield batch

    def iter_weighted(self) -> Iterator[tuple[SequenceBatch, torch.Tensor]]:
        """All batches with per-sample weights (0: padding)."""
        return self._weighted_from(0)
