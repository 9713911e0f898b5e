"""Categorical id mapping: plain hashing into table sizes, or the MLPerf two-pass vocabulary.

MLPerf vocabulary (both DLRM v1 and DCNv2 pipelines): every 32-bit categorical is
hashed modulo 40,000,000, then each column's distinct hashed values over ALL given
files are numbered 0..n-1 in sorted order. That needs two streaming passes:

1. count: per file and column, the set of hashed values seen (a bool array of
   `hash_range` per column: 26 x 40 MB = 1.04 GB per worker process at the MLPerf
   range, touched lazily); saved per file so an interrupted pass resumes;
2. remap: the merged sets become one bitmap per column (40M bits = 5 MB) plus a
   running popcount per 64-bit word (2.5 MB); a value's id is its rank in the
   bitmap. The vocabulary in memory is ~7.5 MB per column (195 MB for 26).

Plain hashing (`id = value % table_size`) is one pass and needs no vocabulary.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from dlrmtrain.data.formats.writes import save_npz
from dlrmtrain.features import NUM_SPARSE

MLPERF_HASH_RANGE = 40_000_000
CATEGORICAL_MODES = ("mlperf_vocab", "hash")


class PlainHash:
    """`id = value % table_size[column]`, the fast one-pass alternative."""

    mode = "hash"

    def __init__(self, table_sizes: list[int]) -> None:
        if len(table_sizes) != NUM_SPARSE or min(table_sizes) < 1:
            raise ValueError(f"hash mode needs {NUM_SPARSE} positive table sizes, got {table_sizes}")
        self.table_sizes = [int(s) for s in table_sizes]
        self._sizes = np.asarray(self.table_sizes, dtype=np.int64)

    def map(self, cats: np.ndarray) -> np.ndarray:
        """uint32 [N, 26] raw values -> int32 [N, 26] ids."""
        return (cats.astype(np.int64) % self._sizes).astype(np.int32)


def _zeroed_bools(shape: tuple[int, int]) -> np.ndarray:
    """A zeroed bool array backed by anonymous memory asking for transparent huge pages.

    The counter writes ids at random over up to 1 GB; 2 MB pages cut its TLB misses and
    page faults (measured ~3x faster here). Memory is still committed only when touched.
    """
    size = shape[0] * shape[1]
    buf = mmap.mmap(-1, max(size, 1))
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass  # huge pages unavailable: plain pages work, only slower
    return np.frombuffer(buf, dtype=bool, count=size).reshape(shape)


class DistinctCounter:
    """Pass 1: which hashed values occur in each column (over the chunks fed to it)."""

    def __init__(self, hash_range: int = MLPERF_HASH_RANGE) -> None:
        self.hash_range = hash_range
        self.seen = _zeroed_bools((NUM_SPARSE, hash_range))
        self._column_offsets = np.arange(NUM_SPARSE, dtype=np.int64) * hash_range

    def add(self, cats: np.ndarray) -> None:
        hashed = cats.astype(np.int64) % self.hash_range
        self.seen.reshape(-1)[(hashed + self._column_offsets).reshape(-1)] = True

    def distinct_values(self) -> list[np.ndarray]:
        """Sorted distinct hashed values per column (uint32)."""
        out = []
        whole_words = self.hash_range // 8 * 8
        for col in self.seen:
            # Skip 8 bytes at a time: most of a 40M-value column is usually empty.
            words = np.flatnonzero(col[:whole_words].view(np.uint64))
            hits = col[:whole_words].reshape(-1, 8)[words]
            values = (words[:, None] * 8 + np.arange(8))[hits]
            tail = whole_words + np.flatnonzero(col[whole_words:])
            out.append(np.concatenate([values, tail]).astype(np.uint32))
        return out


def save_distinct(path: Path, values: list[np.ndarray], hash_range: int) -> None:
    """Write one file's pass-1 result, then rename, so a partial file is never read as done."""
    save_npz(path, sum(v.nbytes for v in values) + NPZ_OVERHEAD_BYTES,
             hash_range=np.int64(hash_range), **{f"col_{i}": v for i, v in enumerate(values)})


NPZ_OVERHEAD_BYTES = 64 * 1024  # zip entries and .npy headers of a few dozen arrays, with room


def distinct_bytes(rows: int, hash_range: int) -> int:
    """At most the bytes of one file's pass-1 result: per column, one uint32 per distinct value."""
    return NUM_SPARSE * min(rows, hash_range) * 4 + NPZ_OVERHEAD_BYTES


def vocabulary_bytes(hash_range: int) -> int:
    """The bytes of vocabulary.npz: one bit per hashed value per column (130 MB at 40M)."""
    return NUM_SPARSE * -(-hash_range // 64) * 8 + NPZ_OVERHEAD_BYTES


def load_distinct(path: Path) -> tuple[list[np.ndarray], int]:
    with np.load(path) as data:
        return [data[f"col_{i}"] for i in range(NUM_SPARSE)], int(data["hash_range"])


class MlperfVocabulary:
    """Pass 2: maps hashed values to their rank among each column's distinct values."""

    mode = "mlperf_vocab"

    def __init__(self, bitmaps: np.ndarray, hash_range: int) -> None:
        # bitmaps: uint64 [26, ceil(hash_range / 64)], bit v set when hashed value v occurs.
        self.hash_range = hash_range
        self.bitmaps = bitmaps
        popcounts = np.bitwise_count(bitmaps).astype(np.int64)
        # ids before each word; int32 halves the cache footprint (a column has < 2^31 ids)
        self.word_rank = (np.cumsum(popcounts, axis=1) - popcounts).astype(np.int32)
        self.table_sizes = [int(n) for n in popcounts.sum(axis=1)]

    @classmethod
    def from_distinct(cls, per_file: list[list[np.ndarray]], hash_range: int) -> "MlperfVocabulary":
        """Merge pass-1 results of all files into one vocabulary."""
        n_words = -(-hash_range // 64)
        bitmaps = np.zeros((NUM_SPARSE, n_words), dtype=np.uint64)
        for columns in per_file:
            for col, values in enumerate(columns):  # sorted distinct values: OR them in word by word
                if len(values) == 0:
                    continue
                words = values.astype(np.int64) >> 6
                starts = np.flatnonzero(np.diff(words, prepend=-1))
                bits = np.left_shift(np.uint64(1), (values & 63).astype(np.uint64))
                bitmaps[col, words[starts]] |= np.bitwise_or.reduceat(bits, starts)
        return cls(bitmaps, hash_range)

    def save(self, path: Path) -> None:
        save_npz(path, vocabulary_bytes(self.hash_range),
                 bitmaps=self.bitmaps, hash_range=np.int64(self.hash_range))

    @classmethod
    def load(cls, path: Path) -> "MlperfVocabulary":
        with np.load(path) as data:
            return cls(data["bitmaps"], int(data["hash_range"]))

    def map(self, cats: np.ndarray) -> np.ndarray:
        """uint32 [N, 26] raw values -> int32 [N, 26] contiguous ids."""
        out = np.empty(cats.shape, dtype=np.int32)
        for col in range(NUM_SPARSE):  # column by column: its 5 MB bitmap + 2.5 MB ranks stay in cache
            hashed = cats[:, col].astype(np.int64) % self.hash_range
            word_idx = hashed >> 6
            words = self.bitmaps[col][word_idx]
            bit = np.left_shift(np.uint64(1), (hashed & 63).astype(np.uint64))
            present = (words & bit) != 0
            if not present.all():
                row = int(np.flatnonzero(~present)[0])
                raise KeyError(
                    f"categorical C{col + 1} value {int(cats[row, col]):08x} (row {row} of this chunk) "
                    "is not in the vocabulary: build it over every file you remap"
                )
            below = np.bitwise_count(words & (bit - np.uint64(1)))
            out[:, col] = self.word_rank[col][word_idx] + below
        return out
