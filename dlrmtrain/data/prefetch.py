"""Background threads that make a loader's batches ahead of the consumer, in order.

numpy copies and gathers, torch conversions, the KJT build and the source transform's
counting pass release the GIL for most of their time, so the batches' making overlaps
the consumer's compute, and `workers` threads make several batches at once (threads,
not processes: a batch is ~0.26 GB of tensors at DLRMv4's reference shape, which a
process would copy into shared memory to hand over, 0.19–0.87 s a batch on the build machine
by its load, about what making the batch costs;
scripts/bench_yambda_data.py --sections workers measures both). Whatever `make` does (pinning, a sparse transform) runs on those
threads, never on the consumer's.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Generic, Iterable, Iterator, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

_MISSING = object()
MAX_DEFAULT_WORKERS = 4
"""data.workers null gives at most this many: at the reference shape one quiet core makes a
batch with its source transform in ~0.2 s of CPU, a quarter of the reference GPU step's ~0.8 s
(data_prep/README.md); the rest of the rank's cores stay with the step"""


def workers_for(configured: int | None, prefetch: int) -> int:
    """The threads a loader makes its batches on: data.workers, or where it is null half this
    rank's share of the cores (the others run the step's threads and the collectives), at least
    1, at most MAX_DEFAULT_WORKERS; 1 where no batch is made ahead (`prefetch` 0)."""
    if configured is not None:
        return configured
    if prefetch <= 0:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    per_rank = cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min(MAX_DEFAULT_WORKERS, per_rank // 2))


class _Failed:
    """An exception of `make` or of the items, raised in the consumer at its item's place."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Prefetcher(Generic[In, Out]):
    """`make(item)` for each item, by `workers` threads, handed over in the items' order; at
    most `depth + workers` items are taken ahead of the consumer (made or in the making), so
    memory stays bounded whatever the consumer's pace.

    An exception in `make` (or in the items) is raised in the consumer at its item's place
    (its traceback the maker's), after every item before it; `close()` (or leaving a `with`
    block, or a generator that `yield from`s it being closed) stops the threads and returns
    without hanging, whatever state they are in (a `make` under way finishes first)."""

    def __init__(self, make: Callable[[In], Out], items: Iterable[In], depth: int,
                 name: str = "batch-prefetch", workers: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        if workers < 1:
            raise ValueError(f"prefetch workers must be at least 1, got {workers}")
        self._make, self._items = make, iter(items)
        self._slots = threading.Semaphore(depth + workers)  # items taken and not yet consumed
        self._taking = threading.Lock()                      # next(items) and its number, together
        self._taken = 0
        self._end: int | None = None                         # the number past the last item
        self._ready: dict[int, object] = {}                  # item number → its result
        self._next = 0                                       # the number the consumer takes next
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=name, daemon=True) for _ in range(workers)]
        for t in self._threads:
            t.start()

    def _take(self) -> tuple[int, object] | None:
        """(number, item) of the next item, or None when there are no more to take."""
        with self._taking:
            if self._end is not None:
                return None
            number = self._taken
            try:
                item = next(self._items)
            except StopIteration:
                self._end = number
                return None
            except BaseException as exc:  # the items failed: that is this number's result
                self._end = number + 1
                return number, _Failed(exc)
            self._taken += 1
            return number, item

    def _work(self) -> None:
        while self._acquire_slot():
            taken = self._take()
            if taken is None:
                self._slots.release()
                break
            number, item = taken
            if isinstance(item, _Failed):
                out = item
            else:
                try:
                    out = self._make(item)
                except BaseException as exc:  # forwarded to the consumer at this item's place
                    out = _Failed(exc)
                    with self._taking:  # nothing after a failure is wanted
                        self._end = number + 1 if self._end is None else min(self._end, number + 1)
            with self._changed:
                self._ready[number] = out
                self._changed.notify_all()
        with self._changed:  # the consumer may be waiting for an end this thread found
            self._changed.notify_all()

    def _acquire_slot(self) -> bool:
        """Wait for room ahead of the consumer unless it has stopped; every wait must watch
        `stop`, or a thread with no reader blocks (and close()'s join) forever."""
        while not self._stop.is_set():
            if self._slots.acquire(timeout=0.1):
                return True
        return False

    def __iter__(self) -> Iterator[Out]:
        return self

    def __next__(self) -> Out:
        with self._changed:
            while not (self._stop.is_set() or self._next in self._ready or self._past_end()):
                self._changed.wait(timeout=0.1)
            out = _MISSING if self._stop.is_set() else self._ready.pop(self._next, _MISSING)
        if out is _MISSING:  # closed, or past the last item
            self.close()
            raise StopIteration
        self._next += 1
        self._slots.release()
        if isinstance(out, _Failed):
            self.close()
            raise out.exc
        return out  # type: ignore[return-value]

    def _past_end(self) -> bool:
        return self._end is not None and self._next >= self._end

    def close(self) -> None:
        """Stop the threads (each may be mid-`make`: that call finishes first) and wait for them."""
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()

    def __enter__(self) -> "Prefetcher[In, Out]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
