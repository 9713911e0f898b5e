"""Recycled host arrays (dlrmtrain/recycled.py): a buffer comes back only when nothing refers to it."""

from __future__ import annotations

import gc

import numpy as np
import torch

from dlrmtrain.recycled import RecycledArrays


def test_a_buffer_is_used_again_only_once_every_array_and_tensor_over_it_is_gone():
    pool = RecycledArrays(keep=2, min_length=100)
    a = pool.empty(1000)
    a[:] = 7
    first = a.ctypes.data
    kept = torch.from_numpy(a[100:200])[10:20]   # a tensor over a view of it
    del a
    gc.collect()
    b = pool.empty(1000)
    assert b.ctypes.data != first and pool.free == 0 and kept.tolist() == [7] * 10
    del kept
    assert pool.free == 1
    c = pool.empty(990)                          # a little shorter: the same buffer
    assert c.ctypes.data == first and pool.free == 0 and len(c) == 990


def test_the_pool_keeps_a_few_buffers_and_hands_out_one_that_fits():
    pool = RecycledArrays(keep=2, min_length=100)
    a1, a2, a3 = pool.empty(1000), pool.empty(1000), pool.empty(3000)
    at = [a.ctypes.data for a in (a1, a2, a3)]
    del a1, a2, a3
    assert pool.free == 2                        # the longest unused (a1) went back to the allocator
    x = pool.empty(3000)
    y = pool.empty(100)                          # a kept buffer over twice as long: a new one
    assert x.ctypes.data == at[2] and y.ctypes.data not in at and pool.free == 1
    z = pool.empty(1100)                         # a2 was made an eighth longer than asked
    assert z.ctypes.data == at[1] and pool.free == 0
    del x, y, z
    tiny = pool.empty(99)                        # under min_length: never kept
    del tiny
    assert pool.free == 2


def test_scratch_without_slack_takes_any_longer_buffer():
    pool = RecycledArrays(keep=1, min_length=10, slack=None)
    long = pool.empty(10_000)
    at = long.ctypes.data
    del long
    short = pool.empty(20)                       # 500 times shorter: still the kept buffer
    assert short.ctypes.data == at and pool.free == 0
