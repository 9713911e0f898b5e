"""Large host arrays used again once nothing refers to them, so that a loader's batches do not
each cost new memory.

New memory costs the kernel a page fault and a zeroed page for every page the batch first
writes: at DLRMv4's reference shape, a batch's ~0.13 GB of KJT values took ~0.07 s of its
~0.2 s build that way (one EPYC core), and the loader's threads fault against each other.
A `RecycledArrays` hands out arrays over buffers it keeps: each array is owned by a lease,
and when the last array, view or tensor (`torch.from_numpy`) over a lease is gone, the
buffer comes back to the pool, already faulted in, for the next batch. A buffer is never
handed out while anything still refers to it; the pool keeps at most `keep` free buffers
(the longest unused go back to the allocator), so its memory at rest is bounded.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np


class _Lease:
    """Exposes `length` int64 values of `buffer` to numpy; the arrays made over it keep it alive."""

    __slots__ = ("__array_interface__", "buffer", "__weakref__")

    def __init__(self, buffer: np.ndarray, length: int) -> None:
        self.buffer = buffer
        self.__array_interface__ = {"data": (buffer.ctypes.data, False), "shape": (length,),
                                    "typestr": buffer.dtype.str, "version": 3}


class RecycledArrays:
    """int64 arrays over buffers reused once nothing refers to them (thread-safe); arrays
    shorter than `min_length` are plain new ones, and an array takes a free buffer at most
    `slack` times its length (None: any longer one, for scratch whose untouched rest costs nothing)."""

    def __init__(self, keep: int, min_length: int = 1 << 16, slack: float | None = 2.0) -> None:
        self.keep, self.min_length, self.slack = keep, min_length, slack
        self._free: list[np.ndarray] = []
        self._lock = threading.RLock()  # a lease collected while the lock is held comes back in

    def empty(self, length: int) -> np.ndarray:
        """An uninitialised int64 array of `length` (its values: whatever its buffer last held)."""
        if length < self.min_length:  # malloc's own free lists reuse small blocks; kept, they would crowd out
            return np.empty(length, dtype=np.int64)
        buffer = self._take(length)
        if buffer is None:  # an eighth more: batches a little longer later still find it
            buffer = np.empty(length + length // 8, dtype=np.int64)
        lease = _Lease(buffer, length)
        done = weakref.finalize(lease, self._give_back, buffer)
        done.atexit = False
        return np.asarray(lease)

    def _take(self, length: int) -> np.ndarray | None:
        """The smallest free buffer that holds `length` values and at most `slack` times that."""
        longest = None if self.slack is None else self.slack * length + 1
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if length <= len(b) and (longest is None or len(b) <= longest)]
            if not fits:
                return None
            best = min(fits, key=lambda i: len(self._free[i]))
            return self._free.pop(best)

    def _give_back(self, buffer: np.ndarray) -> None:
        with self._lock:
            self._free.append(buffer)
            if len(self._free) > self.keep:  # the longest unused goes back to the allocator
                self._free.pop(0)

    @property
    def free(self) -> int:
        """Buffers waiting to be used again."""
        return len(self._free)
