"""BufferPool never hands out storage that someone still holds."""

from __future__ import annotations

import torch

from dlrmtrain.comm.buffers import BufferPool


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
