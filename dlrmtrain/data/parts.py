"""A `Part` is one memory-mapped piece of a dataset (a day, a file) that can read row ranges.

Every on-disk format (the project's own layout, TorchRec .npy/.npz, the facebookresearch
.bin) is exposed as Parts, so splits and the loader work on any of them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np


@dataclass
class RowBlock:
    """Rows [start, stop) of a part, already in the loader's dtypes."""

    dense: np.ndarray  # float32 [n, 13], transformed (log1p)
    sparse: np.ndarray | list[np.ndarray]  # one-hot: int [n, 26]; multi-hot: 26 arrays int [n, k_t]
    labels: np.ndarray  # float32 [n]

    def __len__(self) -> int:
        return len(self.labels)


class Part(Protocol):
    name: str
    rows: int

    def read(self, start: int, stop: int) -> RowBlock:
        """Rows [start, stop) as a RowBlock (0 <= start <= stop <= rows)."""
        ...


class RowRange:
    """Rows [begin, end) of another part, itself a Part (used by splits)."""

    def __init__(self, part: Part, begin: int, end: int) -> None:
        if not 0 <= begin <= end <= part.rows:
            raise ValueError(f"row range [{begin}, {end}) outside {part.name} ({part.rows} rows)")
        self.part, self.begin, self.end = part, begin, end
        self.name = f"{part.name}[{begin}:{end}]"
        self.rows = end - begin

    def read(self, start: int, stop: int) -> RowBlock:
        return self.part.read(self.begin + start, self.begin + stop)


def concat_blocks(blocks: Sequence[RowBlock]) -> RowBlock:
    """Join blocks read from consecutive parts (a batch can span a part boundary)."""
    if len(blocks) == 1:
        return blocks[0]
    first = blocks[0].sparse
    if isinstance(first, list):
        sparse: np.ndarray | list[np.ndarray] = [
            np.concatenate([b.sparse[t] for b in blocks]) for t in range(len(first))  # type: ignore[index]
        ]
    else:
        sparse = np.concatenate([b.sparse for b in blocks])  # type: ignore[misc]
    return RowBlock(
        dense=np.concatenate([b.dense for b in blocks]),
        sparse=sparse,
        labels=np.concatenate([b.labels for b in blocks]),
    )


def total_rows(parts: Sequence[Part]) -> int:
    return sum(p.rows for p in parts)
