"""The runs test_hstu_attention_triton.py checks, and the process that makes them under Triton's
interpreter:

    TRITON_INTERPRET=1 python tests/models/triton_attention_runs.py OUT.pt

runs each through the Triton kernels on CPU tensors and saves its (out, dq, dk, dv). A process
of its own: Triton reads TRITON_INTERPRET when `@triton.jit` decorates a function, its own
library's included (at `import triton`), so the variable must be set before the process
imports Triton and must not leak into other tests.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dlrmtrain.models.hstu import jagged  # noqa: E402

ALPHA = 0.37

SHAPES = {
    # name: (lengths, num_targets, max_len (the N of 1/N), heads, dqk, dv)
    # longest 27 (not a multiple of the 16-row tile), a length-1 sample (its one row a
    # target), an all-target sample, one with no target, one exactly a tile long; widths
    # that are not powers of two (masked columns)
    "mixed": ([27, 1, 20, 5, 16], [3, 1, 20, 0, 2], 27, 2, 8, 12),
    # N longer than the longest sample; history ending inside a tile, targets past it
    "padded_n": ([30, 7, 17], [1, 7, 16], 32, 3, 16, 16),
}


@dataclass(frozen=True)
class Run:
    shape: str
    dtype: torch.dtype = torch.float32
    seed: int = 0
    tiles: tuple | None = None
    """(forward, dq, dkdv) as (block_m, block_n) pairs; None: the interpreter's defaults (16, 16)."""


RUNS = {
    "mixed": Run("mixed"),
    "padded_n": Run("padded_n"),
    # 32 queries × 16 keys and 16 × 32: the ranges' alignment when the tile sizes differ
    # (a target's diagonal block; the first query block a key block needs)
    "unequal_tiles": Run("mixed", seed=1, tiles=((32, 16), (16, 32), (32, 16))),
    "bf16": Run("mixed", dtype=torch.bfloat16),
}


def inputs(run: Run) -> tuple:
    """(q, k, v, do, offsets, lengths, num_targets, max_len)."""
    lengths, num_targets, max_len, heads, dqk, dv = SHAPES[run.shape]
    lengths, num_targets = torch.tensor(lengths), torch.tensor(num_targets)
    gen = torch.Generator().manual_seed(run.seed)
    total = int(lengths.sum())
    q, k, v, do = (torch.randn(total, heads, d, generator=gen).to(run.dtype) for d in (dqk, dqk, dv, dv))
    return q, k, v, do, jagged.offsets_of(lengths), lengths, num_targets, max_len


def forward_backward(fn, q, k, v, do, offsets, lengths, num_targets, max_len, **kwargs) -> tuple:
    """(out [L, H, dv], dq, dk, dv) of one attention function."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v, offsets, lengths, num_targets, max_len, ALPHA, **kwargs)
    out.backward(do.reshape(out.shape))
    return out.detach().view(do.shape), q.grad, k.grad, v.grad


def main(path: str) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1 (before Triton is imported)")
    from dlrmtrain.models.hstu.attention import triton_kernels as tk

    results = {}
    for name, run in RUNS.items():
        tilings = tk.Tilings(*(tk.Tiling(*t) for t in run.tiles)) if run.tiles else None
        results[name] = forward_backward(tk.triton_silu_attention, *inputs(run), tilings=tilings)
    torch.save(results, path)


if __name__ == "__main__":
    main(sys.argv[1])
