"""Large per-step tensors reused across steps when nothing else still holds them.

On CPU a fresh 50 MB tensor costs more in page faults than the copy that fills
it (comm/README.md, "Buffers"). A buffer is handed out again only when its storage has no
user besides this pool — checked on the storage's use count — so a caller
that keeps last step's output (an eval loop, a pipeline context) simply gets a
new buffer: reuse can never overwrite live data.
"""

from __future__ import annotations

import torch

from dlrmtrain.comm.torchrec_hooks import storage_use_count as _storage_users


class BufferPool:
    """Up to `slots` reusable flat buffers (two: this step's and the last one's)."""

    def __init__(self, slots: int = 2) -> None:
        self._slots = slots
        self._buffers: list[torch.Tensor] = []
        self._idle_users = 0  # use count of a buffer nobody else holds

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
            zero: bool = False) -> torch.Tensor:
        numel = 1
        for s in shape:
            numel *= s
        for i, buf in enumerate(self._buffers):
            if buf.dtype != dtype or buf.device != device or _storage_users(buf) != self._idle_users:
                continue
            if buf.numel() < numel:
                buf = self._buffers[i] = torch.empty(numel, dtype=dtype, device=device)
            out = buf[:numel].view(shape)
            return out.zero_() if zero else out
        buf = torch.zeros(numel, dtype=dtype, device=device) if zero else \
            torch.empty(numel, dtype=dtype, device=device)
        if len(self._buffers) < self._slots:
            self._buffers.append(buf)
            self._idle_users = _storage_users(buf)
        return buf.view(shape)
