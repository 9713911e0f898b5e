"""The one prefetch thread behind both loaders (data/prefetch.py): results in the items'
order, the producer's exception raised in the consumer with the producer's traceback,
and close() stopping the thread from any state without hanging."""

from __future__ import annotations

import threading
import time
import traceback

import pytest

from dlrmtrain.data.prefetch import Prefetcher


def test_results_come_in_the_items_order_made_on_the_named_thread():
    made_on = []

    def make(x):
        made_on.append(threading.current_thread().name)
        return x * x

    assert list(Prefetcher(make, range(50), depth=3, name="test-prefetch")) == [x * x for x in range(50)]
    assert set(made_on) == {"test-prefetch"}


def a_failing_make(x):
    if x == 3:
        raise OSError(f"cannot read item {x}")
    return x


def test_an_exception_in_the_producer_is_raised_in_the_consumer_with_its_traceback():
    got = []
    with pytest.raises(OSError, match="cannot read item 3") as raised:
        for x in Prefetcher(a_failing_make, range(10), depth=2):
            got.append(x)
    assert got == [0, 1, 2]  # everything made before the failure arrived first
    frames = [f.name for f in traceback.extract_tb(raised.value.__traceback__)]
    assert "a_failing_make" in frames  # where it went wrong, not only where it was re-raised


def closes_in_time(prefetcher: Prefetcher) -> None:
    closer = threading.Thread(target=prefetcher.close, daemon=True)
    closer.start()
    closer.join(timeout=30)  # a hang detector, not a timing check
    assert not closer.is_alive(), "close() hung"
    assert not prefetcher._thread.is_alive()


def test_close_stops_a_producer_blocked_on_a_full_queue():
    prefetcher = Prefetcher(lambda x: x, range(1_000_000), depth=2)
    assert next(prefetcher) == 0
    time.sleep(0.3)  # let it fill the queue and wait on it
    closes_in_time(prefetcher)
    with pytest.raises(StopIteration):  # a closed prefetcher yields nothing more
        next(prefetcher)


def test_close_stops_a_producer_mid_item_and_a_finished_one():
    started, release = threading.Event(), threading.Event()

    def slow(x):
        started.set()
        release.wait(30)
        return x

    prefetcher = Prefetcher(slow, [0, 1], depth=1)
    started.wait(30)
    threading.Timer(0.2, release.set).start()  # the item in hand finishes, then it stops
    closes_in_time(prefetcher)
    finished = Prefetcher(lambda x: x, [], depth=1)
    assert list(finished) == []
    closes_in_time(finished)


def test_a_closed_generator_that_yields_from_it_stops_the_thread():
    def batches():
        with Prefetcher(lambda x: x, range(1_000_000), depth=2) as made:
            yield from made

    gen = batches()
    assert next(gen) == 0
    closer = threading.Thread(target=gen.close, daemon=True)
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive()
    assert not any(t.name == "batch-prefetch" and t.is_alive() for t in threading.enumerate())


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        Prefetcher(lambda x: x, [1], depth=0)
