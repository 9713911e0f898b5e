"""Memory-mapped, rank-sliced, prefetching batch loader yielding torchrec `Batch` objects.

The parts of a split are one concatenated row sequence. It is cut into global
batches of `global_batch_size` consecutive rows; rank r of W reads only rows
[r * L, (r + 1) * L) of each global batch (L = global_batch_size / W), so no rank
touches another rank's rows and the page cache holds only what is used.

Order: with `shuffle=True` the order of the full global batches is a permutation
drawn from (seed, epoch), identical on every rank; rows inside a batch keep the
file order (the MLPerf Terabyte days 0-22 are already shuffled on disk, and
contiguous reads keep the loader at memory speed). Without shuffle: file order.

Last-batch policy (`last_batch`), for the R = rows % global_batch_size rows left
after the full batches:
- "drop": they are not yielded; `dropped_rows` says how many (train default).
- "partial": one final, smaller global batch; rank r gets R // W rows, plus one
  if r < R % W (so a rank may get an empty batch when R < W); every row is then
  yielded exactly once across ranks.
- "pad": one final global batch of W equal slices of ceil(R / W) rows (rank r
  takes rows [r * ceil(R/W), ...) of the remainder); slots past the data are
  filled with copies of the remainder's first row with weight 0 (`iter_weighted`),
  so every rank joins every collective and padding never reaches a metric
  (eval default: every real row exactly once with weight 1).
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.features import CAT_KEYS, TABLE_NAMES
from dlrmtrain.data.parts import Part, RowBlock, concat_blocks
from dlrmtrain.data.prefetch import Prefetcher

LAST_BATCH_POLICIES = ("drop", "partial", "pad")


def pins_for(device: torch.device) -> bool:
    """Whether batches bound for `device` are built in page-locked (pinned) memory. A copy
    to the GPU from pageable memory is staged and synchronous whatever `non_blocking`
    says; from pinned memory it is a DMA that overlaps the step. Only CUDA has pinned
    memory (pin_memory() raises without it)."""
    return torch.device(device).type == "cuda"


def fold_ids(block: RowBlock, table_rows: Sequence[int]) -> RowBlock:
    """`id % rows` per table, for models whose tables are smaller than the data's vocabulary."""
    rows = np.asarray(table_rows, dtype=np.int64)
    if isinstance(block.sparse, list):
        sparse: np.ndarray | list[np.ndarray] = [ids % rows[t] for t, ids in enumerate(block.sparse)]
    else:
        sparse = np.asarray(block.sparse) % rows
    return RowBlock(block.dense, sparse, block.labels)


def check_ids_in_range(block: RowBlock, table_rows: Sequence[int], first_row: int) -> None:
    """Raise naming the table when an id is outside its table (negative or >= rows):
    corrupt data, or tables smaller than the data's vocabulary."""
    tables = block.sparse if isinstance(block.sparse, list) else np.asarray(block.sparse).T
    for t, ids in enumerate(tables):
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= table_rows[t]):
            bad = int(ids.max()) if ids.max() >= table_rows[t] else int(ids.min())
            raise ValueError(f"table {TABLE_NAMES[t]}: id {bad} in rows {first_row}..{first_row + len(block) - 1} "
                             f"is outside its {table_rows[t]} rows (corrupt data, or data.table_sizes "
                             f"smaller than the data's vocabulary)")


@dataclass
class PooledBatch(Batch):
    """TorchRec's `Batch` whose `record_stream` also reaches its KJT's inverse indices, which
    `KeyedJaggedTensor.record_stream` leaves out: a pipeline copies a variable-batch KJT
    (dedup at the source, comm/placement.py) on its copy stream, and the sharded EBC expands the rows with them
    on the default one. `to` and `pin_memory` keep the class (TorchRec's build a `Batch`).

    `distinct_features`: under `comm.codec: auto` at the source, the variable-batch KJT of the
    batch's distinct bags beside the full one (comm/auto/source.py picks one per step)."""

    distinct_features: KeyedJaggedTensor | None = None

    def to(self, device: torch.device, non_blocking: bool = False) -> "PooledBatch":
        moved = Batch(self.dense_features, self.sparse_features, self.labels).to(device, non_blocking)
        distinct = self.distinct_features
        return PooledBatch(**vars(moved), distinct_features=None if distinct is None
                           else distinct.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "PooledBatch":
        pinned = Batch(self.dense_features, self.sparse_features, self.labels).pin_memory()
        distinct = self.distinct_features
        return PooledBatch(**vars(pinned), distinct_features=None if distinct is None else distinct.pin_memory())

    def record_stream(self, stream: torch.Stream) -> None:
        super().record_stream(stream)
        for kjt in (self.sparse_features, self.distinct_features):
            inverse = kjt.inverse_indices_or_none() if kjt is not None else None
            if inverse is not None:
                inverse[1].record_stream(stream)
        if self.distinct_features is not None:
            self.distinct_features.record_stream(stream)


def block_to_batch(block: RowBlock) -> Batch:
    """RowBlock -> torchrec Batch (dense float32 [n, 13], KJT int64 keyed cat_0..cat_25, labels [n])."""
    n = len(block)
    if isinstance(block.sparse, list):  # multi-hot: table t contributes [n, k_t] ids
        values = torch.cat([torch.from_numpy(np.ascontiguousarray(ids)).reshape(-1) for ids in block.sparse])
        lengths = torch.cat([torch.full((n,), ids.shape[1], dtype=torch.int32) for ids in block.sparse])
        values = values.to(torch.int64)
    else:  # one-hot: table-major order, i.e. the transpose of the [n, 26] id matrix
        ids = torch.from_numpy(np.asarray(block.sparse))
        values = torch.empty((ids.shape[1], n), dtype=torch.int64)
        values.copy_(ids.t())
        values = values.view(-1)
        lengths = torch.ones(ids.shape[1] * n, dtype=torch.int32)
    sparse = KeyedJaggedTensor(keys=CAT_KEYS, values=values, lengths=lengths, stride=n)
    return PooledBatch(
        dense_features=torch.from_numpy(np.array(block.dense, dtype=np.float32)),
        sparse_features=sparse,
        labels=torch.from_numpy(np.array(block.labels, dtype=np.float32)),
    )


@dataclass(frozen=True)
class SliceSpec:
    """Global rows [start, stop) that one rank reads for one batch."""

    start: int
    stop: int
    padded_size: int  # >= stop - start; extra slots repeat row `pad_row` with weight 0
    pad_row: int


class RowSource:
    """Random access to global row ranges over a sequence of parts."""

    def __init__(self, parts: Sequence[Part]) -> None:
        self.parts = list(parts)
        self.offsets = np.cumsum([0] + [p.rows for p in self.parts]).tolist()
        self.rows = self.offsets[-1]

    def read(self, start: int, stop: int) -> RowBlock:
        if stop <= start:  # an empty share of a small last batch
            return self.parts[0].read(0, 0)
        blocks = []
        i = max(bisect.bisect_right(self.offsets, start) - 1, 0)
        while True:
            part_start = self.offsets[i]
            lo, hi = start - part_start, min(stop, self.offsets[i + 1]) - part_start
            blocks.append(self.parts[i].read(max(lo, 0), hi))
            if self.offsets[i + 1] >= stop:
                break
            i += 1
        return concat_blocks(blocks)


@dataclass(frozen=True)
class CriteoLoaderSpec:
    """What one rank's CriteoBatchLoader cuts from its rows, and how it makes the batches."""

    global_batch_size: int
    rank: int = 0
    world_size: int = 1
    shuffle: bool = False
    """Shuffle the order of the global batches, by `seed` and the epoch (same on every rank)."""
    seed: int = 0
    last_batch: str = "drop"
    """One of LAST_BATCH_POLICIES (see the module docstring)."""
    prefetch: int = 2
    """Batches made ahead on background threads (0: made where they are read)."""
    workers: int = 1
    """Threads making those batches, each a whole batch at a time (data.workers)."""
    fold_to_rows: Sequence[int] | None = None
    """Per-table row counts to fold ids into (`id % rows`) when the model's tables are
    smaller than the data's vocabulary (scaled-down runs); None = ids as stored, checked
    against `table_rows` when given (an id outside its table is an error)."""
    table_rows: Sequence[int] | None = None
    pin_memory: bool = False
    """Build each batch and its weights in pinned memory (see `pins_for`)."""


class CriteoBatchLoader:
    """Iterable of `Batch` for one rank; see the module docstring for slicing, order and last
    batch, and CriteoLoaderSpec for its settings.

    `sparse_transform`: applied to each batch's KJT where the batch is made (the prefetch
    thread), e.g. dedup at the source's distinct bags (set by the trainer once the model
    is sharded: `Datasets.set_sparse_transform`); with `keep_full_batch` its KJT goes beside
    the full one (`PooledBatch.distinct_features`: comm.codec auto at the source).
    """

    def __init__(self, parts: Sequence[Part], spec: CriteoLoaderSpec) -> None:
        global_batch_size, rank, world_size = spec.global_batch_size, spec.rank, spec.world_size
        if global_batch_size % world_size:
            raise ValueError(f"global batch {global_batch_size} is not divisible by world size {world_size}")
        if spec.last_batch not in LAST_BATCH_POLICIES:
            raise ValueError(f"last_batch must be one of {LAST_BATCH_POLICIES}, got {spec.last_batch!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.source = RowSource(parts)
        self.global_batch_size, self.rank, self.world_size = global_batch_size, rank, world_size
        self.local_batch_size = global_batch_size // world_size
        self.shuffle, self.seed, self.epoch = spec.shuffle, spec.seed, 0
        self.last_batch, self.prefetch, self.workers = spec.last_batch, spec.prefetch, spec.workers
        self.pin_memory = spec.pin_memory  # set by build_datasets from the device (pins_for)
        self.sparse_transform: Callable[[KeyedJaggedTensor], KeyedJaggedTensor] | None = None
        self.keep_full_batch = False  # True: the transform's KJT goes beside the full one (distinct_features)
        self.fold_to_rows = list(spec.fold_to_rows) if spec.fold_to_rows is not None else None
        self.table_rows = list(spec.table_rows) if spec.table_rows is not None else None
        self.full_batches, self.remainder = divmod(self.source.rows, global_batch_size)
        self.dropped_rows = self.remainder if spec.last_batch == "drop" else 0

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle permutation for an epoch (same on every rank)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.full_batches + (1 if self.last_batch != "drop" and self.remainder else 0)

    def slices(self) -> list[SliceSpec]:
        """This rank's global row range for every batch, in yield order."""
        order = np.arange(self.full_batches)
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.full_batches)
        first = order * self.global_batch_size + self.rank * self.local_batch_size
        specs = [SliceSpec(int(s), int(s) + self.local_batch_size, self.local_batch_size, int(s)) for s in first]
        if self.remainder and self.last_batch != "drop":
            specs.append(self._last_slice())
        return specs

    def _last_slice(self) -> SliceSpec:
        begin = self.full_batches * self.global_batch_size
        if self.last_batch == "partial":
            base, extra = divmod(self.remainder, self.world_size)
            sizes = [base + (r < extra) for r in range(self.world_size)]
            start = begin + sum(sizes[: self.rank])
            return SliceSpec(start, start + sizes[self.rank], sizes[self.rank], start)
        local = -(-self.remainder // self.world_size)  # "pad": equal slices of ceil(R / W)
        start = min(begin + self.rank * local, self.source.rows)
        stop = min(start + local, self.source.rows)
        return SliceSpec(start, stop, local, begin)

    def _make(self, spec: SliceSpec) -> tuple[Batch, torch.Tensor]:
        block = self.source.read(spec.start, spec.stop)
        weight = torch.ones(spec.padded_size)
        n_pad = spec.padded_size - (spec.stop - spec.start)
        if n_pad:
            filler = self.source.read(spec.pad_row, spec.pad_row + 1)
            block = concat_blocks([block] + [filler] * n_pad)
            weight[spec.padded_size - n_pad :] = 0.0
        if self.fold_to_rows is not None:
            block = fold_ids(block, self.fold_to_rows)
        elif self.table_rows is not None:
            check_ids_in_range(block, self.table_rows, spec.start)
        batch = block_to_batch(block)
        if self.sparse_transform is not None:  # here too: the step's thread never waits for it
            made = self.sparse_transform(batch.sparse_features)
            batch = dataclasses.replace(batch, **{"distinct_features" if self.keep_full_batch
                                                  else "sparse_features": made})
        if self.pin_memory:  # here, on the prefetch thread when there is one
            return batch.pin_memory(), weight.pin_memory()
        return batch, weight

    def iter_weighted(self, start: int = 0) -> Iterator[tuple[Batch, torch.Tensor]]:
        """(batch, per-sample weight) pairs from batch `start` of the epoch on (a resumed
        run reads nothing it skips); weight 0 marks "pad" filler rows."""
        specs = self.slices()[start:]
        if self.prefetch <= 0:
            yield from map(self._make, specs)
        else:
            with Prefetcher(self._make, specs, self.prefetch, name="batch-prefetch", workers=self.workers) as made:
                yield from made

    def batches_from(self, start: int) -> Iterator[Batch]:
        for batch, _ in self.iter_weighted(start):
            yield batch

    def __iter__(self) -> Iterator[Batch]:
        return self.batches_from(0)

