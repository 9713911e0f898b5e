"""Counting host syncs on CPU: a TorchFunctionMode that records every call that would
make a GPU wait for the host (or the host for the GPU) when it comes from the codec layer.

On CPU nothing actually waits, but the same Python calls are what sync on a GPU:
reading a device value (`tolist`, `item`, `bool`/`int`/`float` of a tensor),
ops whose output size depends on the data (`nonzero`, `masked_select`, `unique`,
`repeat_interleave` without `output_size`), and building a device tensor from a
Python list (`torch.tensor(..., device=...)`: a blocking host-to-device copy).
Only calls made by the codec dists (the innermost non-library frame lies in
dlrmtrain/comm/{codecs,dedup,auto,sequence}/, so TorchRec methods they call count too) are counted:
TorchRec's and the model's own syncs do not blur the codec's. Those made while a dist
plans a later pass ahead (under a `plan_ahead` call: the pipeline's input stage, off the
step's critical path) are kept apart, in `ahead`.
"""

from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode

_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
          torch.Tensor.__float__, torch.Tensor.__index__}
_DATA_SIZED = {torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.Tensor.masked_select,
               torch.unique, torch.Tensor.unique, torch.unique_consecutive}
_REPEAT = {torch.repeat_interleave, torch.Tensor.repeat_interleave}
CODEC_PACKAGES = ("codecs", "dedup", "auto", "sequence")


def _is_sync(func, args, kwargs) -> bool:
    if func in _READS or func in _DATA_SIZED:
        return True
    if func in _REPEAT:  # needs output_size unless the repeats are a Python int
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    if func in (torch.tensor, torch.as_tensor):
        return kwargs.get("device") is not None
    return False


class HostSyncCounter(TorchFunctionMode):
    """`syncs`: (function name, codec file:line) of each counted call on the critical path;
    `ahead`: the same for calls made while planning a later pass ahead."""

    def __init__(self, extra_files: tuple[str, ...] = (), direct_only: bool = False) -> None:
        """`extra_files`: paths under dlrmtrain/ whose calls count too (e.g. "comm/torchrec/",
        where `comm.dedup_at: source`'s expand lives); `direct_only`: only the calls those files make
        themselves, not those of the TorchRec / fbgemm methods they call (counted apart, in `library`)."""
        super().__init__()
        self.direct_only = direct_only
        self.library: list[tuple[str, str]] = []
        self.syncs: list[tuple[str, str]] = []
        self.ahead: list[tuple[str, str]] = []
        self._places = tuple(f"dlrmtrain/comm/{pkg}/" for pkg in CODEC_PACKAGES) + tuple(
            f"dlrmtrain/{f}" for f in extra_files)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_sync(func, args, kwargs):
            # the innermost frame outside libraries (torch, TorchRec, fbgemm) and this file
            ours = [f for f in traceback.extract_stack()
                    if "site-packages" not in f.filename and not f.filename.endswith("sync_counter.py")]
            if ours and any(place in ours[-1].filename for place in self._places):
                where = f"{ours[-1].filename.split('dlrmtrain/')[-1]}:{ours[-1].lineno}"
                caller = [f for f in traceback.extract_stack() if "site-packages/torch/" not in f.filename
                          and not f.filename.endswith("sync_counter.py")][-1]
                if self.direct_only and "site-packages" in caller.filename:
                    self.library.append((getattr(func, "__name__", str(func)),
                                         f"{caller.filename.split('site-packages/')[-1]}:{caller.lineno}"))
                    return func(*args, **kwargs)
                ahead = any(f.name == "plan_ahead" and "dlrmtrain/comm/" in f.filename for f in ours)
                (self.ahead if ahead else self.syncs).append((getattr(func, "__name__", str(func)), where))
        return func(*args, **kwargs)
