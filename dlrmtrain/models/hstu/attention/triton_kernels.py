"""HSTU's pointwise attention as Triton kernels on the jagged layout: SiLU(q·k · alpha) / N
under the causal, target-aware mask (mask.py), N the batch's padded length, as
`padded_silu_attention` computes it, without ever building a score matrix.

Forward: one program per (query block, head, sample) visits only the key blocks that hold a
valid pair for some row of its block: the history keys up to the block's last row (causal)
and, where the block holds targets, the key blocks on its own diagonal (a target sees all
history and itself). Blocks past a sample's length do nothing.

Backward, recomputing each tile's scores and never keeping them (memory O(tokens × width)):
one program per (key block, head, sample) for dk and dv, looping over the query blocks that
see its keys (every row from the block on for a history key; its own diagonal for a target
key), and one per (query block, head, sample) for dq, looping over the forward's key blocks.
Each output row is written by exactly one program: no atomics, the same bits every run.

Numerics: the scores, SiLU, the 1/N and every accumulation are fp32; the tile fed to the
second product (scores into ·v, score gradients into ·q and ·k) is cast to the input dtype,
as in FlashAttention and the reference's kernel, so bf16 inputs run on bf16 tensor cores.
fp32 inputs use `input_precision="ieee"` (true fp32 products, not TF32), so fp32 results
differ from the padded kernel only in rounding order (the sums, and SiLU's few operations).

Runs on CUDA tensors, or on CPU tensors when `TRITON_INTERPRET=1` was set before Triton was
imported (Triton reads it when `@triton.jit` decorates a function, its own library's
included): Triton's interpreter, for tests, slow. Triton 3.6's interpreter takes neither a
tensor as a `range` bound nor bf16 operands to `tl.dot`, so there (INTERPRETED) the loops are
`while` loops and bf16 products are widened to fp32 first; on a GPU, `for` loops (which the
pipeliner overlaps) and bf16 tensor cores. The kernels keep to the Triton API that 3.6 and
later releases share: pointer arithmetic (no block pointers, no tensor descriptors), checked
under the interpreter and compiled for sm_90 with 3.6 and 3.9 (scripts/compile_attention.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _sample(offsets, num_targets, sample):
    """(first row in the jagged tensor (int64: 1,024 × 4,096 rows × 512 columns passes int32),
    length, history length = length - targets)."""
    start = tl.load(offsets + sample)
    length = (tl.load(offsets + sample + 1) - start).to(tl.int32)
    history = length - tl.load(num_targets + sample).to(tl.int32)
    return start, length, history


@triton.jit
def _may_attend(rows, cols, length, history):
    """mask.py's rule on broadcast row and column positions: i == j, or id(i) > id(j) with
    id(p) = min(p, history); both inside the sample."""
    attend = (rows == cols) | (tl.minimum(rows, history) > tl.minimum(cols, history))
    return attend & (rows < length) & (cols < length)


@triton.jit
def _key_ranges(m0, length, history, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The key blocks query rows [m0, m0 + BLOCK_M) must visit, as two ranges of block starts:
    [0, causal_end) (history keys up to the block's last row) and [diagonal_start,
    diagonal_end) (the targets' own diagonal; empty when the block holds no target)."""
    causal_end = (tl.minimum(m0 + BLOCK_M, history) + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    diagonal_start = tl.maximum(causal_end, m0 // BLOCK_N * BLOCK_N)
    diagonal_end = tl.minimum(m0 + BLOCK_M, length)
    return causal_end, diagonal_start, diagonal_end


@triton.jit
def _tile_offsets(rows, length, stride, WIDTH: tl.constexpr, BLOCK_D: tl.constexpr):
    """(offsets, mask) of rows × [0, BLOCK_D) in a [rows, stride] slab: rows past the sample's
    length masked, columns only past a width that is not a power of two. The widths are
    constexprs so that the compiler sees whole rows as contiguous: a column mask against a
    runtime width split the bf16 loads into 2-byte ones, too narrow for the pipeliner's
    asynchronous copies (scripts/compile_attention.py shows them)."""
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < length)[:, None]
    if WIDTH < BLOCK_D:
        mask = mask & (cols < WIDTH)[None, :]
    return rows[:, None] * stride + cols[None, :], mask


@triton.jit
def _load_tile(base, rows, length, stride, WIDTH: tl.constexpr, BLOCK_D: tl.constexpr):
    """[len(rows), BLOCK_D] tile, zeros past the sample's length and the width."""
    offsets, mask = _tile_offsets(rows, length, stride, WIDTH, BLOCK_D)
    return tl.load(base + offsets, mask=mask, other=0.0)


@triton.jit
def _store_tile(base, value, rows, length, stride, WIDTH: tl.constexpr, BLOCK_D: tl.constexpr):
    """Stores an fp32 tile in the tensor's dtype, rows past the sample's length left alone."""
    offsets, mask = _tile_offsets(rows, length, stride, WIDTH, BLOCK_D)
    tl.store(base + offsets, value.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    """a @ b accumulated in fp32. DOT: "native" (bf16 tensor cores), "ieee" (fp32 operands
    multiplied in fp32, not TF32) or "widened" (Triton 3.6's interpreter, which multiplies bf16
    operands as their raw 16-bit patterns: both widened to fp32 first, which is what a GPU's
    bf16 product with an fp32 accumulator computes, a product of two bf16 values being exact
    in fp32)."""
    if DOT == "widened":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif DOT == "ieee":
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _silu_over_n(s, valid, inv_n):
    """mask · SiLU(s) / N, in fp32."""
    return tl.where(valid, s * tl.sigmoid(s) * inv_n, 0.0)


@triton.jit
def _silu_over_n_gradient(s, dp, valid, inv_n):
    """d(mask · SiLU(s)/N)/ds · dp, with SiLU'(s) = σ(s)(1 + s(1 − σ(s)))."""
    sig = tl.sigmoid(s)
    return tl.where(valid, dp * sig * (1.0 + s * (1.0 - sig)) * inv_n, 0.0)


@triton.jit
def _program(offsets, num_targets, num_heads, num_blocks, BLOCK: tl.constexpr):
    """This program's (head, its block's first row in the sample, the sample's first row in
    the jagged tensor, length, history). Grid: one axis, blocks fastest, (sample, head) outer
    (no 65,535 cap on B·H, as a second grid axis would have)."""
    pid = tl.program_id(0)
    sample_head = pid // num_blocks
    sample = sample_head // num_heads
    start, length, history = _sample(offsets, num_targets, sample)
    return sample_head % num_heads, (pid % num_blocks) * BLOCK, start, length, history


@triton.jit
def _query_tile(acc, q, do, K, V, rows, n0, length, history, alpha, inv_n, num_heads,
                DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr,
                BLOCK_DV: tl.constexpr, DOT: tl.constexpr, GRAD: tl.constexpr):
    """acc + one key block's share of a query block's output, (mask · SiLU(s)/N) @ v, or with
    GRAD of its dq / alpha, dS @ k, the scores recomputed (do: the output's gradient rows, read
    with GRAD only)."""
    cols = n0 + tl.arange(0, BLOCK_N)
    k = _load_tile(K, cols, length, num_heads * DIM_QK, DIM_QK, BLOCK_DQK)
    v = _load_tile(V, cols, length, num_heads * DIM_V, DIM_V, BLOCK_DV)
    s = _dot(q, tl.trans(k), DOT) * alpha
    # the mask is made in each branch, after the products before it: made once above the branch,
    # it changed fp32 dq's sm_90 machine code (register allocation); this way both are unchanged
    if GRAD:
        ds = _silu_over_n_gradient(s, _dot(do, tl.trans(v), DOT),
                                   _may_attend(rows[:, None], cols[None, :], length, history), inv_n)
        return acc + _dot(ds.to(k.dtype), k, DOT)
    else:
        p = _silu_over_n(s, _may_attend(rows[:, None], cols[None, :], length, history), inv_n)
        return acc + _dot(p.to(v.dtype), v, DOT)


@triton.jit
def _query_keys(acc, q, do, K, V, rows, n0, n_end, length, history, alpha, inv_n, num_heads,
                DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DQK: tl.constexpr,
                BLOCK_DV: tl.constexpr, DOT: tl.constexpr, INTERPRETED: tl.constexpr, GRAD: tl.constexpr):
    """acc + the key blocks starting at n0, n0 + BLOCK_N, ... below n_end (`_query_tile`). Under
    Triton 3.6's interpreter a `range` cannot take a tensor bound (its scalars are 1-element
    arrays, which numpy 2.4 refuses to turn into ints; fixed in later Tritons): a `while` loop
    there, the `for` loop Triton software-pipelines on a GPU."""
    if INTERPRETED:
        while n0 < n_end:
            acc = _query_tile(acc, q, do, K, V, rows, n0, length, history, alpha, inv_n, num_heads,
                              DIM_QK, DIM_V, BLOCK_N, BLOCK_DQK, BLOCK_DV, DOT, GRAD)
            n0 += BLOCK_N
    else:
        for block in range(n0, n_end, BLOCK_N):
            acc = _query_tile(acc, q, do, K, V, rows, block, length, history, alpha, inv_n, num_heads,
                              DIM_QK, DIM_V, BLOCK_N, BLOCK_DQK, BLOCK_DV, DOT, GRAD)
    return acc


@triton.jit
def _query_block(Q, K, V, DO, Out, offsets, num_targets, alpha, inv_n, num_heads, num_blocks,
                 DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, DOT: tl.constexpr, INTERPRETED: tl.constexpr,
                 GRAD: tl.constexpr):
    """One query block and head of the output (Out: [L, H, dv]) or, with GRAD, of dq (Out:
    [L, H, dqk], DO read): Σ over the key blocks `_key_ranges` names."""
    head, m0, start, length, history = _program(offsets, num_targets, num_heads, num_blocks, BLOCK_M)
    if m0 < length:
        rows = m0 + tl.arange(0, BLOCK_M)
        Q += start * num_heads * DIM_QK + head * DIM_QK
        K += start * num_heads * DIM_QK + head * DIM_QK
        V += start * num_heads * DIM_V + head * DIM_V
        if GRAD:
            Out += start * num_heads * DIM_QK + head * DIM_QK
            DO += start * num_heads * DIM_V + head * DIM_V
        else:
            Out += start * num_heads * DIM_V + head * DIM_V
        q = _load_tile(Q, rows, length, num_heads * DIM_QK, DIM_QK, BLOCK_DQK)
        if GRAD:
            do = _load_tile(DO, rows, length, num_heads * DIM_V, DIM_V, BLOCK_DV)
            acc = tl.zeros([BLOCK_M, BLOCK_DQK], dtype=tl.float32)
        else:
            do = q  # not read
            acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        causal_end, diagonal_start, diagonal_end = _key_ranges(m0, length, history, BLOCK_M, BLOCK_N)
        acc = _query_keys(acc, q, do, K, V, rows, 0, causal_end, length, history, alpha, inv_n, num_heads,
                          DIM_QK, DIM_V, BLOCK_N, BLOCK_DQK, BLOCK_DV, DOT, INTERPRETED, GRAD)
        acc = _query_keys(acc, q, do, K, V, rows, diagonal_start, diagonal_end, length, history, alpha, inv_n,
                          num_heads, DIM_QK, DIM_V, BLOCK_N, BLOCK_DQK, BLOCK_DV, DOT, INTERPRETED, GRAD)
        if GRAD:
            _store_tile(Out, acc * alpha, rows, length, num_heads * DIM_QK, DIM_QK, BLOCK_DQK)
        else:
            _store_tile(Out, acc, rows, length, num_heads * DIM_V, DIM_V, BLOCK_DV)


@triton.jit
def _forward_kernel(Q, K, V, Out, offsets, num_targets, alpha, inv_n, num_heads, num_blocks,
                    DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, DOT: tl.constexpr,
                    INTERPRETED: tl.constexpr):
    """Out of one query block and head (`_query_block`)."""
    _query_block(Q, K, V, Q, Out, offsets, num_targets, alpha, inv_n, num_heads, num_blocks, DIM_QK, DIM_V,
                 BLOCK_M, BLOCK_N, BLOCK_DQK, BLOCK_DV, DOT, INTERPRETED, False)


@triton.jit
def _dq_kernel(Q, K, V, DO, DQ, offsets, num_targets, alpha, inv_n, num_heads, num_blocks,
               DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, DOT: tl.constexpr, INTERPRETED: tl.constexpr):
    """dq of one query block and head: the forward's grid and key blocks (`_query_block`)."""
    _query_block(Q, K, V, DO, DQ, offsets, num_targets, alpha, inv_n, num_heads, num_blocks, DIM_QK, DIM_V,
                 BLOCK_M, BLOCK_N, BLOCK_DQK, BLOCK_DV, DOT, INTERPRETED, True)


@triton.jit
def _dkdv_tile(dk, dv, k, v, Q, DO, cols, m0, length, history, alpha, inv_n, num_heads,
               DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, DOT: tl.constexpr):
    """(dk / alpha, dv) + one query block's share, computed on transposed tiles ([keys,
    queries]) so that the sums over the queries are plain products."""
    rows = m0 + tl.arange(0, BLOCK_M)
    q = _load_tile(Q, rows, length, num_heads * DIM_QK, DIM_QK, BLOCK_DQK)
    do = _load_tile(DO, rows, length, num_heads * DIM_V, DIM_V, BLOCK_DV)
    valid = _may_attend(rows[None, :], cols[:, None], length, history)
    s = _dot(k, tl.trans(q), DOT) * alpha
    dv += _dot(_silu_over_n(s, valid, inv_n).to(do.dtype), do, DOT)
    ds = _silu_over_n_gradient(s, _dot(v, tl.trans(do), DOT), valid, inv_n)
    return dk + _dot(ds.to(q.dtype), q, DOT), dv


@triton.jit
def _dkdv_queries(dk, dv, k, v, Q, DO, cols, m0, m_end, length, history, alpha, inv_n, num_heads,
                  DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DQK: tl.constexpr,
                  BLOCK_DV: tl.constexpr, DOT: tl.constexpr, INTERPRETED: tl.constexpr):
    """(dk, dv) + the query blocks from m0 below m_end (`while` under the interpreter:
    `_query_keys`)."""
    if INTERPRETED:
        while m0 < m_end:
            dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, cols, m0, length, history, alpha, inv_n, num_heads,
                                DIM_QK, DIM_V, BLOCK_M, BLOCK_DQK, BLOCK_DV, DOT)
            m0 += BLOCK_M
    else:
        for block in range(m0, m_end, BLOCK_M):
            dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, cols, block, length, history, alpha, inv_n, num_heads,
                                DIM_QK, DIM_V, BLOCK_M, BLOCK_DQK, BLOCK_DV, DOT)
    return dk, dv


@triton.jit
def _dkdv_kernel(Q, K, V, DO, DK, DV, offsets, num_targets, alpha, inv_n, num_heads, num_blocks,
                 DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_DQK: tl.constexpr, BLOCK_DV: tl.constexpr, DOT: tl.constexpr, INTERPRETED: tl.constexpr):
    """dk and dv of one key block and head, over the query blocks that see its keys: every row
    from the block on while it holds a history key, else (targets only) its own diagonal."""
    head, n0, start, length, history = _program(offsets, num_targets, num_heads, num_blocks, BLOCK_N)
    if n0 < length:
        cols = n0 + tl.arange(0, BLOCK_N)
        K += start * num_heads * DIM_QK + head * DIM_QK
        DK += start * num_heads * DIM_QK + head * DIM_QK
        V += start * num_heads * DIM_V + head * DIM_V
        DV += start * num_heads * DIM_V + head * DIM_V
        k = _load_tile(K, cols, length, num_heads * DIM_QK, DIM_QK, BLOCK_DQK)
        v = _load_tile(V, cols, length, num_heads * DIM_V, DIM_V, BLOCK_DV)
        query_end = length
        if n0 >= history:
            query_end = tl.minimum(n0 + BLOCK_N, length)
        dk, dv = _dkdv_queries(tl.zeros([BLOCK_N, BLOCK_DQK], dtype=tl.float32),
                               tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32), k, v,
                               Q + start * num_heads * DIM_QK + head * DIM_QK,
                               DO + start * num_heads * DIM_V + head * DIM_V, cols, n0 // BLOCK_M * BLOCK_M,
                               query_end, length, history, alpha, inv_n, num_heads,
                               DIM_QK, DIM_V, BLOCK_M, BLOCK_DQK, BLOCK_DV, DOT, INTERPRETED)
        _store_tile(DK, dk * alpha, cols, length, num_heads * DIM_QK, DIM_QK, BLOCK_DQK)
        _store_tile(DV, dv, cols, length, num_heads * DIM_V, DIM_V, BLOCK_DV)


@dataclass(frozen=True)
class Tiling:
    """Tile sizes and launch shape of one kernel (powers of two; tl.dot needs ≥ 16)."""

    block_m: int
    """Query rows per tile."""
    block_n: int
    """Key rows per tile."""
    num_warps: int = 4
    """Warps per program (ignored by the interpreter)."""
    num_stages: int = 2
    """Software-pipelining depth of the loops (ignored by the interpreter)."""


@dataclass(frozen=True)
class Tilings:
    """The three kernels' tiles."""

    forward: Tiling
    """Output: a program per query block (block_m), looping over key blocks (block_n)."""
    dq: Tiling
    """dq: the same grid and loop as the forward."""
    dkdv: Tiling
    """dk, dv: a program per key block (block_n), looping over query blocks (block_m)."""


def default_tilings(dtype: torch.dtype, interpreted: bool) -> Tilings:
    """16-row tiles under the interpreter (tiny test shapes). On a GPU, the largest tiles that
    Triton 3.6 compiled for sm_90 at widths 128 without spilling registers (ptxas -v): bf16
    64 × 64 (forward, dq; 4 warps) and 32 queries × 64 keys (dk/dv; 8 warps); fp32, whose
    exact products run on the FMA units, 32 × 16 and 16 × 32 on 8 warps. Not autotuned."""
    if interpreted:
        return Tilings(Tiling(16, 16), Tiling(16, 16), Tiling(16, 16))
    if dtype == torch.float32:
        return Tilings(Tiling(32, 16, num_warps=8), Tiling(32, 16, num_warps=8), Tiling(16, 32, num_warps=8))
    return Tilings(Tiling(64, 64), Tiling(64, 64), Tiling(32, 64, num_warps=8))


def _interpreted() -> bool:
    """Whether this module's kernels run in Triton's interpreter (decided when it was imported)."""
    return type(_forward_kernel).__name__ == "InterpretedFunction"


def _dot_mode(dtype: torch.dtype) -> str:
    """`_dot`'s DOT for these inputs on this module's backend."""
    if _interpreted():
        return "widened"
    return "ieee" if dtype == torch.float32 else "native"


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
           num_targets: torch.Tensor) -> None:
    if q.dtype not in (torch.float32, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"triton attention takes fp32 or bf16 q, k, v of one dtype, got {q.dtype}, {k.dtype}, "
                        f"{v.dtype}")
    if q.shape != k.shape or q.dim() != 3 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"triton attention: q, k [L, H, dqk] and v [L, H, dv], got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    devices = {t.device for t in (q, k, v, offsets, num_targets)}
    if len(devices) != 1:
        raise ValueError(f"triton attention: all inputs on one device, got {sorted(map(str, devices))}")
    if q.device.type != "cuda" and not _interpreted():
        raise RuntimeError(f"triton attention runs on CUDA tensors (got {q.device}); on CPU only under Triton's "
                           f"interpreter, TRITON_INTERPRET=1 set before {__name__} is imported")


def _launch(kernel, tiling: Tiling, blocks: int, tensors: tuple, offsets: torch.Tensor,
            num_targets: torch.Tensor, alpha: float, max_len: int) -> None:
    """One program per (block of `blocks`, head, sample), on the inputs' device (Triton
    launches on the current device's current stream: the guard makes that the inputs' own)."""
    q, v = tensors[0], tensors[2]
    total, heads, dim_qk = q.shape
    programs = blocks * heads * (offsets.numel() - 1)
    if total == 0 or programs == 0:
        return
    if programs >= 2 ** 31:
        raise ValueError(f"triton attention: {programs} programs pass CUDA's grid limit of 2**31 - 1")
    with torch.cuda.device(q.device) if q.device.type == "cuda" else contextlib.nullcontext():
        kernel[(programs,)](*tensors, offsets, num_targets, alpha, 1.0 / max_len, heads, blocks,
                            DIM_QK=dim_qk, DIM_V=v.shape[2], BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n,
                            BLOCK_DQK=max(16, triton.next_power_of_2(dim_qk)),
                            BLOCK_DV=max(16, triton.next_power_of_2(v.shape[2])),
                            DOT=_dot_mode(q.dtype), INTERPRETED=_interpreted(),
                            num_warps=tiling.num_warps, num_stages=tiling.num_stages)


class TritonSiluAttention(torch.autograd.Function):
    """Forward and backward kernels as one autograd function; keeps q, k, v (inputs, already
    alive) for the backward, never the scores."""

    @staticmethod
    def forward(ctx, q, k, v, offsets, num_targets, max_len, alpha, tilings):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        offsets, num_targets = offsets.to(torch.int64).contiguous(), num_targets.to(torch.int64).contiguous()
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
        _launch(_forward_kernel, tilings.forward, triton.cdiv(max_len, tilings.forward.block_m), (q, k, v, out),
                offsets, num_targets, alpha, max_len)
        ctx.save_for_backward(q, k, v, offsets, num_targets)
        ctx.max_len, ctx.alpha, ctx.tilings = max_len, alpha, tilings
        return out.view(q.shape[0], -1)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, offsets, num_targets = ctx.saved_tensors
        do = grad_out.reshape(v.shape).contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        tiles = ctx.tilings
        _launch(_dq_kernel, tiles.dq, triton.cdiv(ctx.max_len, tiles.dq.block_m), (q, k, v, do, dq),
                offsets, num_targets, ctx.alpha, ctx.max_len)
        _launch(_dkdv_kernel, tiles.dkdv, triton.cdiv(ctx.max_len, tiles.dkdv.block_n), (q, k, v, do, dk, dv),
                offsets, num_targets, ctx.alpha, ctx.max_len)
        return dq, dk, dv, None, None, None, None, None


def triton_silu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offsets: torch.Tensor,
                          lengths: torch.Tensor, num_targets: torch.Tensor, max_len: int,
                          alpha: float, *, tilings: Tilings | None = None) -> torch.Tensor:
    """q, k: [L, H, dqk]; v: [L, H, dv] jagged → [L, H·dv] jagged, as `padded_silu_attention`
    (fp32 or bf16; CUDA, or CPU under the interpreter). `tilings`: `default_tilings`' unless given.

    `lengths` is implied by `offsets` (kept for the common signature); no sample may be longer
    than `max_len` (its rows past it would be left unwritten; checking would cost a host sync)."""
    del lengths
    _check(q, k, v, offsets, num_targets)
    tilings = tilings or default_tilings(q.dtype, _interpreted())
    return TritonSiluAttention.apply(q, k, v, offsets, num_targets, max_len, alpha, tilings)
