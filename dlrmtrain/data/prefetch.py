"""A background thread that makes a loader's batches ahead of the consumer.

numpy copies, torch conversions and the KJT build release the GIL for much of their
time, so the reads overlap the consumer's compute. Whatever `make` does (pinning, a
sparse transform) runs on that thread, never on the consumer's.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Generic, Iterable, Iterator, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

_DONE = object()


class Prefetcher(Generic[In, Out]):
    """`make(item)` for each item, in order, made on a thread `depth` results ahead.

    An exception in `make` is raised in the consumer (its traceback the producer's);
    `close()` (or leaving a `with` block, or a generator that `yield from`s it being
    closed) stops the thread and returns without hanging, whatever state it is in."""

    def __init__(self, make: Callable[[In], Out], items: Iterable[In], depth: int,
                 name: str = "batch-prefetch") -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self._make, self._items = make, items
        self._results: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name=name, daemon=True)
        self._thread.start()

    def _put(self, out) -> bool:
        """Hand `out` over unless the consumer has stopped; every put must watch `stop`,
        or a full queue with no reader blocks the thread (and close()'s join) forever."""
        while not self._stop.is_set():
            try:
                self._results.put(out, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._items:
                if not self._put(self._make(item)):
                    return
            self._put(_DONE)
        except BaseException as exc:  # forwarded to the consumer
            self._put(exc)

    def __iter__(self) -> Iterator[Out]:
        return self

    def __next__(self) -> Out:
        if self._stop.is_set():
            raise StopIteration
        out = self._results.get()
        if out is _DONE:
            self.close()
            raise StopIteration
        if isinstance(out, BaseException):
            self.close()
            raise out
        return out

    def close(self) -> None:
        """Stop the thread (it may be mid-`make`: that call finishes first) and wait for it."""
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> "Prefetcher[In, Out]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
