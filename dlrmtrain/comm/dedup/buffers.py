"""Large per-step tensors reused across steps when nothing else still holds them.

On CPU a fresh 50 MB tensor costs more in page faults than the copy that fills
it (comm/README.md, "Buffers"). A buffer is handed out again only when its storage has no
user besides this pool — checked on the storage's use count — so a caller
that keeps last step's output (an eval loop, a pipeline context) simply gets a
new buffer: reuse can never overwrite live data.
"""

from __future__ import annotations

import torch

from dlrmtrain.comm.dedup.kernels import scatter_rows
from dlrmtrain.comm.torchrec.torch_internals import storage_use_count as _storage_users


class BufferPool:
    """Up to `slots` reusable flat buffers (two: this step's and the last one's)."""

    def __init__(self, slots: int = 2) -> None:
        self._slots = slots
        self._buffers: list[torch.Tensor] = []
        self._idle_users = 0  # use count of a buffer nobody else holds
        # slot -> (row width, index) of the rows `scattered` last wrote there: the slot's
        # whole buffer is zero but for those rows
        self._written: dict[int, tuple[int, torch.Tensor]] = {}

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
            zero: bool = False) -> torch.Tensor:
        out, slot = self._take(shape, dtype, device, zero)
        self._written.pop(slot, None)  # the caller may write anywhere
        return out

    def scattered(self, shape: tuple[int, int], index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """A `shape` buffer that is zero except row index[u] = rows[u] (`scatter_rows` into zeros).

        A buffer reused with the same row width is cleared only at the rows its
        last scatter wrote (the rest are still zero), not whole, even when the
        row count changed (a sequence owner's values differ every step): at
        MLPerf's shape that is ~1/4 of a 50 MB memset per step. Otherwise the
        slot's whole buffer is zeroed, so that it holds nothing but this
        scatter's rows afterwards.
        """
        out, slot = self._take(shape, rows.dtype, rows.device, zero=False)
        last = self._written.get(slot) if slot is not None else None
        width = shape[1]
        if last is not None and last[0] == width:
            buf = self._buffers[slot]
            buf[:buf.numel() // width * width].view(-1, width).index_fill_(0, last[1], 0)
        elif slot is not None:
            self._buffers[slot].zero_()
        else:
            out.zero_()
        if slot is not None:
            self._written[slot] = (width, index)
        return scatter_rows(out, index, rows)

    def _take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
              zero: bool) -> tuple[torch.Tensor, int | None]:
        """A buffer of `shape` and the pool slot it lives in (None: not pooled)."""
        numel = 1
        for s in shape:
            numel *= s
        for i, buf in enumerate(self._buffers):
            if buf.dtype != dtype or buf.device != device or _storage_users(buf) != self._idle_users:
                continue
            if buf.numel() < numel:
                buf = self._buffers[i] = torch.empty(numel, dtype=dtype, device=device)
                self._written.pop(i, None)
            out = buf[:numel].view(shape)
            return (out.zero_() if zero else out), i
        buf = torch.zeros(numel, dtype=dtype, device=device) if zero else \
            torch.empty(numel, dtype=dtype, device=device)
        if len(self._buffers) < self._slots:
            self._buffers.append(buf)
            self._idle_users = _storage_users(buf)
            return buf.view(shape), len(self._buffers) - 1
        return buf.view(shape), None
