"""BufferPool never hands out storage that someone still holds."""

from __future__ import annotations

import torch

from dlrmtrain.comm.dedup.buffers import BufferPool


def test_reuses_a_released_buffer() -> None:
    pool = BufferPool()
    a = pool.get((4, 3), torch.float32, torch.device("cpu"))
    ptr = a.data_ptr()
    del a
    b = pool.get((4, 3), torch.float32, torch.device("cpu"))
    assert b.data_ptr() == ptr


def test_never_overwrites_a_buffer_still_held() -> None:
    pool = BufferPool()
    kept = pool.get((8,), torch.float32, torch.device("cpu"))
    kept.fill_(7.0)
    view = kept[2:5]  # a view elsewhere keeps the storage alive too
    del kept
    other = pool.get((8,), torch.float32, torch.device("cpu"), zero=True)
    other2 = pool.get((8,), torch.float32, torch.device("cpu"), zero=True)
    assert torch.equal(view, torch.full((3,), 7.0))
    assert other.data_ptr() != view.data_ptr() and other2.data_ptr() != other.data_ptr()


def test_zeroed_and_grown_on_demand() -> None:
    pool = BufferPool()
    a = pool.get((2, 2), torch.float32, torch.device("cpu"))
    a.fill_(1.0)
    del a
    b = pool.get((3, 3), torch.float32, torch.device("cpu"), zero=True)
    assert b.shape == (3, 3) and torch.equal(b, torch.zeros(3, 3))


def _scatter_into_zeros(shape, index, rows):
    return torch.zeros(shape).index_copy_(0, index, rows)


def test_scattered_clears_what_the_last_scatter_wrote() -> None:
    """A reused gradient buffer is reset at last step's rows only: every other
    row must still read zero, whatever get() or another shape did in between."""
    pool = BufferPool(slots=1)
    g = torch.Generator().manual_seed(0)
    shape = (50, 4)
    for step in range(6):
        index = torch.randperm(50, generator=g)[: 5 + 7 * step % 40]
        rows = torch.randn(index.numel(), 4, generator=g)
        out = pool.scattered(shape, index, rows)
        assert torch.equal(out, _scatter_into_zeros(shape, index, rows)), step
        ptr = out.data_ptr()
        del out
        if step == 2:  # someone else writes the whole slot: the next scatter must clear it all
            pool.get((200,), torch.float32, torch.device("cpu")).fill_(3.0)
        if step == 4:  # another shape over the same storage
            pool.scattered((25, 8), torch.tensor([1]), torch.ones(1, 8))
    assert pool.scattered(shape, index, rows).data_ptr() == ptr  # it did reuse the storage


def test_scattered_with_another_row_count_clears_only_the_last_rows() -> None:
    """A sequence owner's gradient has another row count every step: the buffer is still
    reused and reset at the last scatter's rows only, and reads as fresh zeros plus the rows."""
    pool = BufferPool(slots=1)
    g = torch.Generator().manual_seed(1)
    for step, n in enumerate([40, 30, 45, 10, 45]):
        index = torch.randperm(n, generator=g)[: n // 3]
        rows = torch.randn(index.numel(), 4, generator=g)
        fills = []
        original = torch.Tensor.zero_
        torch.Tensor.zero_ = lambda t: fills.append(t.numel()) or original(t)
        try:
            out = pool.scattered((n, 4), index, rows)
        finally:
            torch.Tensor.zero_ = original
        assert torch.equal(out, _scatter_into_zeros((n, 4), index, rows)), step
        if step in (1, 3):  # smaller than the buffer: no whole memset
            assert fills == [], (step, fills)
        del out


def test_scattered_while_the_last_one_is_held_gives_fresh_zeros() -> None:
    pool = BufferPool(slots=1)
    held = pool.scattered((6, 2), torch.tensor([0, 5]), torch.ones(2, 2))
    other = pool.scattered((6, 2), torch.tensor([3]), torch.full((1, 2), 2.0))
    assert other.data_ptr() != held.data_ptr()
    assert torch.equal(other, _scatter_into_zeros((6, 2), torch.tensor([3]), torch.full((1, 2), 2.0)))
    assert torch.equal(held, _scatter_into_zeros((6, 2), torch.tensor([0, 5]), torch.ones(2, 2)))
