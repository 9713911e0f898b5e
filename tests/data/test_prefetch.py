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
    assert not any(t.is_alive() for t in prefetcher._threads)


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


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_several_workers_hand_results_over_in_the_items_order_with_bounded_memory(workers):
    # items finish out of order (later ones faster): the consumer still sees them in order,
    # and never more than depth + workers items are taken ahead of it
    taken, consumed, ahead, threads = [0], [0], [], set()

    def items():
        for x in range(40):
            taken[0] += 1
            ahead.append(taken[0] - consumed[0])
            yield x

    def make(x):
        threads.add(threading.get_ident())
        time.sleep(0.002 * ((40 - x) % 4))
        return x * x

    got = []
    for y in Prefetcher(make, items(), depth=2, workers=workers):
        got.append(y)
        consumed[0] += 1
    assert got == [x * x for x in range(40)]
    assert max(ahead) <= 2 + workers
    assert len(threads) <= workers


def test_a_failure_among_several_workers_comes_after_every_item_before_it():
    got = []
    with pytest.raises(OSError, match="cannot read item 3"):
        for x in Prefetcher(a_failing_make, range(1000), depth=2, workers=3):
            got.append(x)
    assert got == [0, 1, 2]


def test_close_stops_several_workers_blocked_or_mid_item():
    started, release = threading.Event(), threading.Event()

    def slow(x):
        if x == 5:
            started.set()
            release.wait(30)
        return x

    prefetcher = Prefetcher(slow, range(1_000_000), depth=2, workers=3)
    assert next(prefetcher) == 0
    started.wait(30)  # one worker mid-item, the others waiting for room
    threading.Timer(0.2, release.set).start()
    closes_in_time(prefetcher)


def test_fewer_than_one_worker_is_refused():
    with pytest.raises(ValueError, match="workers must be at least 1"):
        Prefetcher(lambda x: x, [1], depth=1, workers=0)
