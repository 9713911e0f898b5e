"""The expand of distinct rows back to the batch, as autograd functions (torch only).

Dedup at the source (comm/dedup/source.py) receives one pooled row per distinct bag; the
sharded EBC's awaitable (comm/torchrec/pooled_source.py) expands them with these: `ExpandRows`
(`rows[index]`) and `ExpandRowsBehind` (the same rows behind a leading row per sample, DLRM's
interaction input), each backward one `index_add` (fp32 for 16-bit rows).
"""

from __future__ import annotations

import functools

import torch


class ExpandRows(torch.autograd.Function):
    """`rows[index]`; the backward sums each row's gradients (`index_add`, in fp32 for 16-bit rows)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.rows_shape, ctx.rows_dtype = rows.shape, rows.dtype
        return rows.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (index,) = ctx.saved_tensors
        if grad.dtype in (torch.float16, torch.bfloat16):
            summed = torch.zeros(ctx.rows_shape, dtype=torch.float32, device=grad.device)
            return summed.index_add_(0, index, grad.float()).to(ctx.rows_dtype), None
        return torch.zeros(ctx.rows_shape, dtype=grad.dtype, device=grad.device).index_add_(0, index, grad), None


def _leading_slots(batch: int, per_sample: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[batch, per_sample]: the places of `ExpandRowsBehind`'s leading rows in its table (0, 1, ...),
    made once per shape and stream (the same every step) and only read. Per stream: on CUDA the
    `arange` runs on the stream current at its first use, and a read on another stream would have
    no event ordering it after that write."""
    stream = torch.cuda.current_stream(device).stream_id if device.type == "cuda" else None
    return _leading_slots_on(batch, per_sample, dtype, device, stream)


@functools.lru_cache(maxsize=8)
def _leading_slots_on(batch: int, per_sample: int, dtype: torch.dtype, device: torch.device,
                      stream: int | None) -> torch.Tensor:
    return torch.arange(batch * per_sample, dtype=dtype, device=device).view(batch, per_sample)


class ExpandRowsBehind(torch.autograd.Function):
    """`cat((leading.unsqueeze(1), rows[index - n].view(B, -1, D)), 1)` in one gather: leading [B, D],
    rows [U, d] (d divides D: a column-wise table's shards, d < D, are a feature's D/d adjacent
    blocks), index [B, K] into rows, each entry plus n = B·D/d (the leading rows come first in the
    table the gather reads, `cat((leading as n rows of d, rows))`), give [B, 1 + K·d/D, D], each
    sample's leading row before its rows, as DLRM's interaction concatenates its dense row before
    the pooled ones (models/dlrm.py), without the expand's copy of B·K·d values and the
    concatenation's second one. Its backward reads the incoming gradient in place: the leading
    rows' gradient is its first block (the concatenation's backward, bitwise), and one
    `index_add` with the gather's own index sums each row's gradients (the leading places' sums
    are dropped): the rows' sums are `ExpandRows`'s, bitwise (same adds in the same order; fp32
    for 16-bit rows), without the copy that made the incoming gradient's row blocks contiguous."""

    @staticmethod
    def forward(ctx, leading: torch.Tensor, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        d, (B, D) = rows.size(1), leading.shape
        gather = torch.cat((_leading_slots(B, D // d, index.dtype, index.device), index), 1)
        ctx.save_for_backward(gather)
        ctx.rows_shape, ctx.rows_dtype, ctx.leading_rows = rows.shape, rows.dtype, B * (D // d)
        table = torch.cat((leading.reshape(-1, d), rows))
        return table.index_select(0, gather.view(-1)).view(B, -1, D)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (gather,) = ctx.saved_tensors
        (U, d), n = ctx.rows_shape, ctx.leading_rows
        wide = grad.dtype in (torch.float16, torch.bfloat16)
        flat = grad.reshape(-1, d)
        summed = torch.zeros(n + U, d, dtype=torch.float32 if wide else grad.dtype, device=grad.device)
        summed.index_add_(0, gather.view(-1), flat.float() if wide else flat)
        return grad[:, 0], summed[n:].to(ctx.rows_dtype), None
