"""One prepared device check of DLRMv4's Triton attention: right first, then how fast and how
small, beside the padded kernel, printed as one table.

    PYTHONPATH=. python scripts/gpu_check_attention.py [--device auto|cpu|cuda] [--iters 5]

1. numeric: triton against padded (in fp32) on a small case, in bf16 and in fp32, forward
   and every gradient, within attention/rounding.py's bound (worst error / bound ≤ 1);
2. timing, at the full config's layer shape (N = 4,096 rows, 4 heads, q/k and v widths 128,
   bf16, alpha 1/√128) with the reference's fill: one layer's attention forward + backward
   (inputs made outside the timed region; the median of --iters after one warm-up run), its
   peak memory (torch.cuda.max_memory_allocated, inputs included) and tokens per second:
   - padded at the largest batch it fits (doubling from 1 sample until out of memory),
   - triton at that same batch, and at the largest batch it fits (estimated from the free
     memory and the bytes a token needs, then tried, a quarter smaller after each out of
     memory).

Sample lengths (the reference's Yambda fill): 8 contextual rows, three history pools of up to
1,362 events (listen_plus, like, skip: the reference's interleaved history) and 1 candidate,
the one target row. Anchors have ≥ 4,086 earlier events and the history scans 20,000 events
back, so the listen_plus and skip pools are drawn full; the like pool fills 105 of its 1,362
slots on average (the reference gin's note), drawn exponential with that mean, capped at
1,362 — an assumed shape, only the mean is the reference's. Lengths 2,733..4,095, mean about
2,838 of the 4,096 rows every sample pays for when padded.

Needs torch and triton only (a lent GPU machine has no TorchRec or fbgemm). `--device cpu`
runs the same steps under Triton's interpreter (TRITON_INTERPRET=1, set here before Triton is
imported) at tiny sizes (N = 32, 2 heads, widths 16, pools of 7) with batches capped at 2:
CI runs it (tests/scripts/test_gpu_check_attention.py) with TorchRec and fbgemm blocked.
Exits 1 if a numeric check fails.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from check_table import Row, report  # noqa: E402  (scripts/, torch-free)

# torch only: none of these imports Triton (the kernels module is imported by main(), once
# it has chosen whether Triton interprets)
from dlrmtrain.models.hstu import jagged  # noqa: E402
from dlrmtrain.models.hstu.attention import padded_silu_attention, rounding  # noqa: E402

triton_kernels = None
"""attention/triton_kernels.py, imported by `load_kernels`."""


@dataclass(frozen=True)
class Shape:
    """One layer's attention at a size, and how its samples fill it."""

    max_len: int
    """N: every sample's padded length, and the 1/N."""
    heads: int
    dim: int
    """q/k and v widths."""
    contextual: int
    pool_slots: int
    """Slots of each of the three history pools."""
    like_mean: float
    """Mean fill of the like pool (the other two are full)."""
    batch_cap: int
    """No batch past this is tried (the CPU mode's stand-in for running out of memory)."""


FULL = Shape(max_len=4096, heads=4, dim=128, contextual=8, pool_slots=1362, like_mean=105.0, batch_cap=1 << 20)
TINY = Shape(max_len=32, heads=2, dim=16, contextual=2, pool_slots=7, like_mean=2.0, batch_cap=2)


def draw_lengths(shape: Shape, batch: int, device, seed: int = 1) -> torch.Tensor:
    """Sample lengths of the module docstring's fill: contextual + two full pools + an
    exponential like pool (capped) + 1 candidate. One seed for every batch: a batch that
    was found to fit is the batch that is timed."""
    gen = torch.Generator().manual_seed(seed)
    like = torch.empty(batch).exponential_(1.0 / shape.like_mean, generator=gen).round().clamp(max=shape.pool_slots)
    lengths = shape.contextual + 2 * shape.pool_slots + like.long() + 1
    return lengths.clamp(max=shape.max_len).to(device)


def make_inputs(lengths: torch.Tensor, num_targets: torch.Tensor, shape: Shape, max_len: int, dtype) -> tuple:
    """(q, k, v, grad_out, offsets, lengths, num_targets, max_len) on the lengths' device,
    q, k, v and grad_out standard normal (the scores' scale is alpha = 1/√width)."""
    total = int(lengths.sum())
    gen = torch.Generator(device=lengths.device).manual_seed(0)
    q, k, v, do = (torch.randn(total, shape.heads, shape.dim, generator=gen, device=lengths.device, dtype=dtype)
                   for _ in range(4))
    return q, k, v, do, jagged.offsets_of(lengths), lengths, num_targets, max_len


def filled_inputs(shape: Shape, batch: int, device) -> tuple:
    """A bf16 batch of the reference's fill at the shape's N, one target (the candidate) per sample."""
    lengths = draw_lengths(shape, batch, device)
    return make_inputs(lengths, torch.ones_like(lengths), shape, shape.max_len, torch.bfloat16)


def forward_backward(fn, q, k, v, do, offsets, lengths, num_targets, max_len, alpha) -> tuple:
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v, offsets, lengths, num_targets, max_len, alpha)
    out.backward(do.reshape(out.shape))
    return out.detach(), q.grad, k.grad, v.grad


def check_numeric(device, shape: Shape) -> list[Row]:
    """Triton against padded in fp32, bf16 and fp32, on samples of the edge cases: the longest
    not a multiple of any tile, a 1-row sample, an all-target one, one without targets."""
    n = 300 if shape is FULL else 27
    lengths = torch.tensor([n, 1, n * 2 // 3, 16], device=device)
    targets = torch.tensor([1, 1, n * 2 // 3, 0], device=device)
    alpha = shape.dim ** -0.5
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        inputs = make_inputs(lengths, targets, shape, n, dtype)
        exact = tuple(x.float() if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs)
        got = forward_backward(triton_kernels.triton_silu_attention, *inputs, alpha)
        want = forward_backward(padded_silu_attention, *exact, alpha)
        bounds = rounding.magnitudes(*exact, alpha)
        ratios = rounding.worst_ratio(got, want, bounds, rounding.tolerance(dtype, n, shape.dim, shape.dim))
        worst = max(ratios.values())
        detail = ", ".join(f"{part} {r:.3f}" for part, r in ratios.items())
        rows.append(Row("numeric", f"{str(dtype).split('.')[-1]} vs padded fp32, N={n}, lengths "
                        f"{lengths.tolist()}", "ok" if worst <= 1.0 else "FAILED",
                        f"worst error / bound: {detail}", failed=not worst <= 1.0))
    return rows


def _is_oom(error: Exception) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in str(error)


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _runs(fn, shape: Shape, batch: int, device) -> bool:
    try:
        forward_backward(fn, *filled_inputs(shape, batch, device), shape.dim ** -0.5)
        return True
    except RuntimeError as error:  # torch.cuda.OutOfMemoryError is one
        if not _is_oom(error):
            raise
        return False


def fits(fn, shape: Shape, batch: int, device) -> bool:
    """Whether one forward + backward of `batch` samples runs without running out of memory
    (the memory freed after, once the failed step's frames are gone)."""
    ok = _runs(fn, shape, batch, device)
    _free(device)
    return ok


def largest_by_doubling(fn, shape: Shape, device) -> int:
    """The largest power-of-two batch that fits (0: not even one sample)."""
    batch = 0
    while batch * 2 <= shape.batch_cap and fits(fn, shape, max(1, batch * 2), device):
        batch = max(1, batch * 2)
    return batch


def largest_from_free_memory(fn, shape: Shape, device) -> int:
    """The batch the free memory holds at the bytes a token needs (q, k, v, grad_out, out, dq,
    dk, dv in bf16; triton keeps nothing else), tried and shrunk by a quarter until it fits."""
    if device.type != "cuda":
        return shape.batch_cap
    _free(device)
    free, _ = torch.cuda.mem_get_info(device)
    bytes_per_sample = 8 * shape.heads * shape.dim * 2 * float(draw_lengths(shape, 1024, "cpu").float().mean())
    batch = min(shape.batch_cap, int(0.9 * free / bytes_per_sample))
    while batch > 0 and not fits(fn, shape, batch, device):
        batch = batch * 3 // 4
    return batch


def time_step(fn, shape: Shape, batch: int, device, iters: int) -> tuple[float, int, int, int]:
    """(median seconds of forward + backward, peak bytes, input bytes, tokens) at `batch`."""
    inputs = filled_inputs(shape, batch, device)
    input_bytes = sum(x.numel() * x.element_size() for x in inputs[:4])
    alpha = shape.dim ** -0.5
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        forward_backward(fn, *inputs, alpha)  # warm-up: Triton compiles on first use (the interpreter does not)
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(iters):
        sync()
        start = time.perf_counter()
        forward_backward(fn, *inputs, alpha)
        sync()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    tokens = int(inputs[5].sum())
    del inputs
    _free(device)
    return statistics.median(times), peak, input_bytes, tokens


@dataclass
class Timing:
    seconds: float
    peak_bytes: int
    input_bytes: int
    tokens: int

    def row(self, name: str, batch: int, why: str, versus: "Timing | None" = None) -> Row:
        memory = (f"peak {self.peak_bytes / 2**30:.2f} GiB (inputs {self.input_bytes / 2**30:.2f})"
                  if self.peak_bytes else "peak n/a on CPU")
        detail = f"{memory}, {self.tokens:,} tokens, {self.tokens / self.seconds:,.0f} tokens/s"
        if versus is not None:
            detail += f"; {self.seconds / versus.seconds:.3f}x padded's time"
            if self.peak_bytes:
                detail += f", {self.peak_bytes / versus.peak_bytes:.3f}x its peak"
        return Row("timing", f"{name}, {batch} samples ({why})", f"{self.seconds * 1e3:.1f} ms", detail)


def check_timing(device, shape: Shape, iters: int) -> list[Row]:
    """Padded at its largest batch; triton at that batch and at its own largest."""
    triton_attention = triton_kernels.triton_silu_attention
    rows = [Row("timing", "shape", f"N={shape.max_len}, {shape.heads} heads, widths {shape.dim}, bf16, fwd+bwd")]
    padded_batch = largest_by_doubling(padded_silu_attention, shape, device)
    if padded_batch:
        padded = Timing(*time_step(padded_silu_attention, shape, padded_batch, device, iters))
        rows.append(padded.row("padded", padded_batch, "the largest power of two it fits"))
        same = Timing(*time_step(triton_attention, shape, padded_batch, device, iters))
        rows.append(same.row("triton", padded_batch, "padded's batch", versus=padded))
    else:
        rows.append(Row("timing", "padded", "not one sample fits", failed=False))
    triton_batch = largest_from_free_memory(triton_attention, shape, device)
    rows.append(Timing(*time_step(triton_attention, shape, triton_batch, device, iters))
                .row("triton", triton_batch, "the largest it fits"))
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--iters", type=int, default=5, help="timed runs per row (their median)")
    return parser.parse_args(argv)


def load_kernels(choice: str) -> torch.device:
    """The device, and attention/triton_kernels.py imported for it: on CPU under Triton's
    interpreter, which must be chosen before Triton is imported (Triton reads TRITON_INTERPRET
    when it decorates a kernel, its own library's included)."""
    global triton_kernels
    if choice == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    device = torch.device("cuda" if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()) else "cpu")
    if device.type == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--device cpu: Triton was imported before its interpreter could be chosen")
        os.environ["TRITON_INTERPRET"] = "1"
    from dlrmtrain.models.hstu.attention import triton_kernels as module
    triton_kernels = module
    return device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = load_kernels(args.device)
    import triton

    shape = FULL if device.type == "cuda" else TINY
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # padded's fp32 reference: true fp32 products
        print(f"device {torch.cuda.get_device_name(device)}, torch {torch.__version__}, triton {triton.__version__}")
    else:
        print(f"device cpu (Triton's interpreter), torch {torch.__version__}, triton {triton.__version__}")
    started = time.perf_counter()
    rows = check_numeric(device, shape)
    rows += check_timing(device, shape, args.iters if device.type == "cuda" else 1)
    return report(rows, started)


if __name__ == "__main__":
    sys.exit(main())
