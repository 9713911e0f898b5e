"""The window order of the anchors: a chunked counting sort equal to a stable sort by window."""

from __future__ import annotations

import numpy as np

from dlrmtrain.data.yambda import anchor_index
from dlrmtrain.data.yambda.anchor_index import window_order


def test_chunked_window_order_is_a_stable_sort_by_window(monkeypatch):
    rng = np.random.default_rng(0)
    ts = rng.integers(1000, 1000 + 9 * 86_400, 500)           # anchors in user-major order, times mixed
    ts[17] = 1000 - 5                                          # the first anchor sets window 0
    want_w = (ts - ts.min()) // 86_400
    want = np.argsort(want_w, kind="stable")
    for chunk in (7, 64, 1 << 26):                             # several passes, and one
        monkeypatch.setattr(anchor_index, "CHUNK", chunk)
        order, offsets, t_min = window_order(lambda lo, hi: ts[lo:hi], len(ts), 86_400)
        assert t_min == ts.min() and order.tolist() == want.tolist()
        assert offsets.tolist() == np.concatenate([[0], np.cumsum(np.bincount(want_w))]).tolist()
    assert window_order(lambda lo, hi: ts[lo:hi], 0, 86_400)[1].tolist() == [0]
