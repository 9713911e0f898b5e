"""HSTU's pointwise attention in plain PyTorch on the jagged layout, tile by tile:
SiLU(q·k · alpha) / N under the causal, target-aware mask (mask.py), N the batch's padded
length, as `padded_silu_attention` computes it, without a [B, H, N, N] score matrix.

A tile pair is up to ROWS_PER_TILE query rows of one sample against up to as many of its keys
(square tiles: row tile i of a sample holds its rows [i·R, (i+1)·R), key tile j its keys
[j·R, (j+1)·R)). Only pairs with at least one (row, key) the mask lets through exist: the
diagonal (j = i), and below it only key tiles that hold history (j·R < history length: a
target sees the history and itself, never another target). Rows and keys past a sample's
length and the upper triangle are never visited. So a pair's scratch is at most R × R scores
per head, whatever N: memory is O(tokens × width) plus one chunk, flat in N.

SiLU attention has no softmax: a row's output is the plain sum of its pairs' shares. Pairs are
run several at a time, in chunks whose fp32 scores fit CHUNK_BYTES (at least one pair). Most
pairs below the diagonal are full: every row of the row tile is in the sample and every key of the
key tile is history, so the mask lets all of their (row, key) through and they run without one
(no mask built, no masked fill: at long sequences the elementwise passes over the scores, not the
products, are most of the time); the others (diagonal pairs, a sample's last row tile, the key
tile holding the history's end) build and apply the mask. A
chunk holds pairs of one diagonal offset d = i − j only, full or masked alike, so no two of its pairs share a row
tile or a key tile: each index_add_ into the fp32 out, dq, dk, dv buffers touches a row at
most once (besides the discarded scratch row), so its atomic adds on CUDA race on nothing,
and every row's pairs are summed in the same order (diagonal offset ascending): the same
inputs and chunk budget give the same bits run to run, on CUDA as on CPU.

Forward and backward are one autograd function that keeps q, k, v (the caller's tensors:
views of the STU layer's projection, which it keeps anyway) and the pair table, never the
scores: the backward recomputes each chunk's scores. Scratch: `chunk_scratch_bytes`.

Numerics: every product and sum in fp32 (float64 inputs: float64), bf16 inputs too (autocast
off inside), results cast back to the inputs' dtype once, at the end. α scales the scores inside
the product (the BLAS's alpha); 1/N scales the row-sized share p·v (forward) and the row-sized
operand do (backward: ds then carries it) instead of the score-sized p, and α the shares ds·k
and dsᵀ·q: a rounding each, on tensors rows_per_tile / d times smaller than the scores. SiLU's
gradient is torch's fused `silu_backward` (one pass over the scores). One host sync per call:
the offsets and target counts, read once to plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

ROWS_PER_TILE = 128
"""Query rows (and keys) per tile: matrix products wide enough to run at the BLAS's speed on CPU."""
CHUNK_BYTES = 2 * 2**20
"""fp32 scores a chunk of tile pairs may hold ([pairs, H, rows, keys]); a pair larger alone is run alone."""
LIVE_SCORE_COPIES = 5
"""fp32 score-sized tensors the backward holds at most at once per chunk (a bound): s (then
p), dp, ds, and on masked chunks the mask with its negation (bool: a quarter each). The forward:
s (then p) and the masks."""


@dataclass(frozen=True)
class Chunk:
    """Pairs [first, last) of the call's pair table, run as one batch of products."""

    first: int
    last: int
    rows: int
    """Rows of its tallest pair (the others are padded to it, masked)."""
    keys: int
    """Keys of its widest pair."""
    masked: bool = True
    """Whether some pair has a (row, key) the mask hides; False: every pair is full (module docstring)."""


def plan_tiles(offsets: torch.Tensor, num_targets: torch.Tensor, heads: int,
               rows_per_tile: int = ROWS_PER_TILE, chunk_bytes: int = CHUNK_BYTES
               ) -> tuple[torch.Tensor, list[Chunk]]:
    """(pair table [P, 5] int64 on the inputs' device: each pair's (first row of its sample in
    the jagged tensor, sample length, history length, first row, first key in the sample),
    sorted by diagonal offset, then by size; the chunks). Reads offsets and num_targets on the
    host once (the call's one sync)."""
    r = rows_per_tile
    both = torch.cat([offsets.reshape(-1).to(torch.int64), num_targets.reshape(-1).to(torch.int64)]).cpu()
    starts, ends = both[:offsets.numel() - 1], both[1:offsets.numel()]
    lengths, history = ends - starts, ends - starts - both[offsets.numel():]
    per_sample = (lengths + r - 1) // r                      # row tiles per sample
    sample = torch.repeat_interleave(torch.arange(lengths.numel()), per_sample)
    tile = torch.arange(sample.numel()) - (torch.cumsum(per_sample, 0) - per_sample)[sample]
    history_tiles = (history[sample] + r - 1) // r          # key tiles holding some history
    # row tile i: its diagonal, then key tiles 0 .. min(i, history_tiles) − 1 below it
    per_tile = 1 + torch.minimum(tile, history_tiles)
    owner = torch.repeat_interleave(torch.arange(tile.numel()), per_tile)
    nth = torch.arange(owner.numel()) - (torch.cumsum(per_tile, 0) - per_tile)[owner]
    row_tile = tile[owner]
    key_tile = torch.where(nth == 0, row_tile, nth - 1)
    s = sample[owner]
    rows = torch.minimum(lengths[s] - row_tile * r, torch.tensor(r))
    keys = torch.minimum(lengths[s] - key_tile * r, torch.tensor(r))
    # full: below the diagonal, a whole row tile of the sample against a whole key tile of history
    full = (key_tile < row_tile) & ((row_tile + 1) * r <= lengths[s]) & ((key_tile + 1) * r <= history[s])
    order = torch.argsort(((row_tile - key_tile) * 2 + (~full)) * (r * r + 1) + rows * keys, stable=True)
    table = torch.stack([starts[s], lengths[s], history[s], row_tile * r, key_tile * r], dim=1)[order]
    diagonal = (row_tile - key_tile)[order]
    return table.to(offsets.device, non_blocking=True), _chunks(
        rows[order].tolist(), keys[order].tolist(), diagonal.tolist(), (~full)[order].tolist(), heads,
        chunk_bytes)


def _chunks(rows: list[int], keys: list[int], diagonal: list[int], masked: list[bool], heads: int,
            chunk_bytes: int) -> list[Chunk]:
    """Consecutive pairs of one diagonal offset, all full or all masked, while the chunk's padded
    fp32 scores fit `chunk_bytes`."""
    chunks, first, most_rows, most_keys = [], 0, 0, 0
    for i, (r, k, d, m) in enumerate(zip(rows, keys, diagonal, masked)):
        tallest, widest = max(most_rows, r), max(most_keys, k)
        if i > first and (d != diagonal[first] or m != masked[first]
                          or (i + 1 - first) * heads * tallest * widest * 4 > chunk_bytes):
            chunks.append(Chunk(first, i, most_rows, most_keys, masked[first]))
            first, tallest, widest = i, r, k
        most_rows, most_keys = tallest, widest
    if rows:
        chunks.append(Chunk(first, len(rows), most_rows, most_keys, masked[first]))
    return chunks


def chunk_scratch_bytes(heads: int, max_len: int, dim_qk: int, dim_v: int,
                        rows_per_tile: int = ROWS_PER_TILE, chunk_bytes: int = CHUNK_BYTES) -> int:
    """The most one chunk holds at once in the backward (fp32), at any padded length `max_len`
    (a pair is at most rows_per_tile² scores per head): LIVE_SCORE_COPIES score-sized tensors,
    its gathered q, k, v and do, and their gradients. The scores are at most max(CHUNK_BYTES,
    one full pair); the per-row and per-key operands follow, a chunk holding rows · keys ≤
    scores / (4·H) over pairs of at most rows_per_tile rows and keys each."""
    del max_len  # flat in N: the tiles are square
    scores = max(chunk_bytes, 4 * heads * rows_per_tile * rows_per_tile)
    elements = scores // (4 * heads * rows_per_tile)     # Σ keys (and Σ rows) over the chunk's pairs
    per_key = 2 * (dim_qk + dim_v)                       # k, v and their gradients
    per_row = 2 * (dim_qk + dim_v)                       # q, do and dq, the output share
    return LIVE_SCORE_COPIES * scores + 4 * heads * elements * (per_key + per_row)


def _positions(tiles: torch.Tensor, chunk: Chunk, total: int) -> tuple[torch.Tensor, ...]:
    """(query row, key row) gather indices into the jagged tensors ([c, rows], [c, keys]; rows
    past a sample's end clamped to its last), the same as write indices (past the end: `total`,
    the scratch row of an L + 1-row buffer), and what the mask of mask.py's rule hides
    ([c, 1, rows, keys]; None on a chunk of full pairs, which hides nothing)."""
    start, length, history, row0, col0 = tiles[chunk.first:chunk.last].unbind(1)
    device = tiles.device
    rows = row0[:, None] + torch.arange(chunk.rows, device=device)     # positions in the sample
    cols = col0[:, None] + torch.arange(chunk.keys, device=device)
    if not chunk.masked:
        row_at, col_at = start[:, None] + rows, start[:, None] + cols
        return row_at, col_at, row_at, col_at, None
    last = (length - 1)[:, None]
    row_at, col_at = start[:, None] + torch.minimum(rows, last), start[:, None] + torch.minimum(cols, last)
    row_in, col_in = rows <= last, cols <= last
    h = history[:, None]
    rows_id, cols_id = torch.minimum(rows, h), torch.minimum(cols, h)
    attend = (rows[:, :, None] == cols[:, None, :]) | (rows_id[:, :, None] > cols_id[:, None, :])
    mask = attend & row_in[:, :, None] & col_in[:, None, :]
    return (row_at, col_at, torch.where(row_in, row_at, total), torch.where(col_in, col_at, total),
            ~mask[:, None])


def _gather(x: torch.Tensor, at: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[L, H, d] rows `at` ([c, n]) → [c, H, n, d] in `dtype`, contiguous: each operand feeds two
    or three batched products, which would otherwise each copy it."""
    return x[at].to(dtype).transpose(1, 2).contiguous()


def _scatter_rows(at: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row indices, [rows, H, d] values) of a chunk's [c, H, n, d] result, for index_add_ into
    an [L + 1, H, d] buffer."""
    return at.reshape(-1), values.transpose(1, 2).reshape(-1, values.shape[1], values.shape[3])


def _scores(q: torch.Tensor, k: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = α·q·kᵀ for one chunk: [c, H, rows, keys], α applied by the product itself."""
    c, heads, rows, dqk = q.shape
    q3, k3 = q.reshape(c * heads, rows, dqk), k.reshape(c * heads, -1, dqk)
    s = torch.baddbmm(q3.new_empty(()), q3, k3.transpose(1, 2), beta=0.0, alpha=alpha)
    return s.view(c, heads, rows, -1)


def _hide(x: torch.Tensor, hidden) -> torch.Tensor:
    """x with the (row, key) the mask hides zeroed, in place (hidden None: nothing is)."""
    return x if hidden is None else x.masked_fill_(hidden, 0.0)


class BlockedSiluAttention(torch.autograd.Function):
    """The tile pairs' forward and backward as one autograd function (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, offsets, num_targets, max_len, alpha, rows_per_tile, chunk_bytes):
        tiles, chunks = plan_tiles(offsets, num_targets, q.shape[1], rows_per_tile, chunk_bytes)
        compute = torch.promote_types(q.dtype, torch.float32)
        total, heads, dim_v = v.shape
        out = torch.zeros(total + 1, heads, dim_v, dtype=compute, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            for chunk in chunks:
                row_at, col_at, row_to, _, hidden = _positions(tiles, chunk, total)
                s = _scores(_gather(q, row_at, compute), _gather(k, col_at, compute), alpha)
                p = _hide(F.silu(s, inplace=True), hidden)
                share = torch.matmul(p, _gather(v, col_at, compute)).mul_(1.0 / max_len)
                out.index_add_(0, *_scatter_rows(row_to, share))
        ctx.save_for_backward(q, k, v, tiles)
        ctx.chunks, ctx.max_len, ctx.alpha = chunks, max_len, alpha
        return out[:total].to(q.dtype).view(total, heads * dim_v)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, tiles = ctx.saved_tensors
        compute = torch.promote_types(q.dtype, torch.float32)
        total = q.shape[0]
        do = grad_out.reshape(v.shape)
        dq, dk, dv = (torch.zeros(total + 1, *x.shape[1:], dtype=compute, device=q.device) for x in (q, k, v))
        inv_n, alpha = 1.0 / ctx.max_len, ctx.alpha
        with torch.autocast(q.device.type, enabled=False):
            for chunk in ctx.chunks:
                row_at, col_at, row_to, col_to, hidden = _positions(tiles, chunk, total)
                qc, kc, vc = _gather(q, row_at, compute), _gather(k, col_at, compute), _gather(v, col_at, compute)
                doc = _gather(do, row_at, compute).mul_(inv_n)          # dL/dp = do·vᵀ / N
                s = _scores(qc, kc, alpha)
                ds = _hide(torch.ops.aten.silu_backward(torch.matmul(doc, vc.transpose(2, 3)), s), hidden)
                p = _hide(F.silu(s, inplace=True), hidden)
                dv.index_add_(0, *_scatter_rows(col_to, torch.matmul(p.transpose(2, 3), doc)))
                dq.index_add_(0, *_scatter_rows(row_to, torch.matmul(ds, kc).mul_(alpha)))
                dk.index_add_(0, *_scatter_rows(col_to, torch.matmul(ds.transpose(2, 3), qc).mul_(alpha)))
        return (dq[:total].to(q.dtype), dk[:total].to(k.dtype), dv[:total].to(v.dtype),
                None, None, None, None, None, None)


def blocked_silu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                           lengths: torch.Tensor, num_targets: torch.Tensor, max_len: int,
                           alpha: float, *, rows_per_tile: int = ROWS_PER_TILE,
                           chunk_bytes: int = CHUNK_BYTES) -> torch.Tensor:
    """q, k: [L, H, dqk]; v: [L, H, dv] jagged → [L, H·dv] jagged, as `padded_silu_attention`
    (any floating dtype, any device). `lengths` is implied by `offsets` (kept for the common
    signature); no sample may be longer than `max_len`. `rows_per_tile`, `chunk_bytes`: the
    module's defaults unless given (tests give small ones to cross many tiles and chunks)."""
    del lengths
    if rows_per_tile < 1 or chunk_bytes < 1:
        raise ValueError(f"blocked attention: rows_per_tile {rows_per_tile} and chunk_bytes {chunk_bytes} "
                         f"must be positive")
    return BlockedSiluAttention.apply(q, k, v, offsets, num_targets, max_len, alpha, rows_per_tile, chunk_bytes)
