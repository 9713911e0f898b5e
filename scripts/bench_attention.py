"""One STU layer's attention, forward + backward, under each attention kernel side by side:
time and peak memory per case, and the issue's goals (issue 42) as ratios.

    PYTHONPATH=. python scripts/bench_attention.py [--kernels padded,blocked] [--sizes 512,1024,2048,4096]
        [--fixed-tokens 4096] [--rounds 3] [--iters 2] [--heads 4] [--width 128] [--json PATH]

The layer is DLRMv4's (4 heads, q/k and v widths 128, alpha 1/√128, fp32, one target per
sample: the candidate). Cases, at every N of --sizes (N: the padded length, the batch's
longest sample, which sets the 1/N and the padded kernel's [B, H, N, N] scores):
  full   one sample of N rows;
  two    two samples: one of N rows and one 30% filled (round(0.3·N) rows);
  fixed  --fixed-tokens rows as tokens / N full samples (N ≤ tokens): the token count fixed
         while N grows (padded's scores grow as tokens·N; a jagged kernel's memory should not).

Measured honestly: every (round, case, kernel) runs in fresh Python processes (`--worker`),
so no allocator cache or earlier case hides memory. In each the inputs (q, k, v, the output's
gradient: O(tokens), the same for every kernel) are made first and a 4-row case runs (the
libraries' lazy set-up); then the process's peak RSS is reset (/proc/self/clear_refs) and one
forward + backward runs: its peak memory is the peak RSS above the RSS before it (on CUDA:
torch.cuda.max_memory_allocated above the allocated bytes before it), under glibc malloc's
defaults, as the issue measured. With --iters > 0 a second process times the case: after that
first run (the warm-up), the median of --iters runs, with malloc set as the training ranks
have it (launch.RANK_MALLOC: large blocks kept in the heap; with it the peak RSS would count
the heap's fragments: 2.1–2.7× the default's at N = 2,048–4,096); with --iters 0 the one cold run is the time.
Processes run one thread (OMP_NUM_THREADS=1), in alternating order (kernels ABC, CBA, ...).
Printed per cell: the median over --rounds and the spread (min–max); MB = 10^6 bytes.

Kernels by name, as `model.hstu.attention` resolves them (attention/kinds.py; `--kernels`,
default padded and blocked, and triton where CUDA is); an unknown name is refused naming the
known ones. On CPU, triton runs only with --allow-interpreter (Triton's interpreter: tiny
sizes only; it is no measure of the GPU kernel's speed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SECOND_FILL = 0.3
"""the `two` case's second sample: this share of N"""


class UnknownKernel(LookupError):
    """A kernel name that model.hstu.attention's kinds do not have."""


def kernel_named(name: str):
    """The attention function of resolved kind `name` (attention/kinds.py, the map the model
    uses; triton is imported only when asked for)."""
    sys.path.insert(0, str(REPO))
    from dlrmtrain.models.hstu.attention import kinds

    if name not in kinds.KINDS:
        raise UnknownKernel(f"unknown attention kernel {name!r} (known: {', '.join(kinds.KINDS)})")
    return kinds.kernel(name)


@dataclass(frozen=True)
class Case:
    kind: str
    """full, two or fixed"""
    max_len: int
    lengths: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def label(self) -> str:
        if self.kind == "two":
            return f"2 × {self.max_len:,} (one full, one {SECOND_FILL:.0%})"
        return f"{len(self.lengths)} × {self.max_len:,} full"


def make_cases(sizes: list[int], fixed_tokens: int) -> list[Case]:
    """The module docstring's cases, by kind then N."""
    cases = [Case("full", n, (n,)) for n in sizes]
    cases += [Case("two", n, (n, max(1, round(SECOND_FILL * n)))) for n in sizes]
    cases += [Case("fixed", n, (n,) * (fixed_tokens // n)) for n in sizes if n <= fixed_tokens]
    return cases


@dataclass(frozen=True)
class Spec:
    """What one worker process runs."""

    kernel: str
    lengths: tuple[int, ...]
    max_len: int
    heads: int
    width: int
    iters: int
    device: str


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


class PeakMemory:
    """Peak bytes above the start of a region: RSS on CPU (the kernel's high-water mark, reset
    at the start), the caching allocator's counters on CUDA."""

    def __init__(self, device) -> None:
        self.device = device

    def start(self) -> None:
        import torch
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
            self.base = _status_kb("VmRSS") * 1024

    def peak(self) -> int:
        import torch
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated(self.device) - self.base
        return _status_kb("VmHWM") * 1024 - self.base


def run_worker(spec: Spec) -> dict:
    """One case under one kernel in this process: {peak_bytes, seconds: [...]}."""
    import gc

    import torch

    sys.path.insert(0, str(REPO))
    from dlrmtrain.models.hstu import jagged

    torch.set_num_threads(1)
    device = torch.device(spec.device)
    if spec.kernel == "triton" and device.type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    fn = kernel_named(spec.kernel)
    lengths = torch.tensor(spec.lengths, device=device)
    num_targets = torch.ones_like(lengths)
    gen = torch.Generator(device=device).manual_seed(0)
    total = int(lengths.sum())
    q, k, v, grad_out = (torch.randn(total, spec.heads, spec.width, generator=gen, device=device)
                         for _ in range(4))
    offsets = jagged.offsets_of(lengths)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def forward_backward(q, k, v, grad_out, offsets, lengths, num_targets, max_len) -> float:
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        sync()
        start = time.perf_counter()
        out = fn(*leaves, offsets, lengths, num_targets, max_len, spec.width ** -0.5)
        out.backward(grad_out.reshape(out.shape))
        sync()
        return time.perf_counter() - start

    inputs = (q, k, v, grad_out, offsets, lengths, num_targets, spec.max_len)
    # a 4-row sample first: the libraries' lazy set-up (autograd's thread, kernels' first
    # calls) would count as the case's memory
    forward_backward(*(x[:4] for x in inputs[:4]), jagged.offsets_of(lengths[:1] * 0 + 4),
                     lengths[:1] * 0 + 4, num_targets[:1], 4)
    gc.collect()
    memory = PeakMemory(device)
    memory.start()
    first = forward_backward(*inputs)
    peak = memory.peak()
    gc.collect()
    seconds = [forward_backward(*inputs) for _ in range(spec.iters)] or [first]
    return {"peak_bytes": peak, "seconds": seconds}


def _worker(spec: Spec, env: dict, timeout: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(asdict(spec))],
                         capture_output=True, text=True, timeout=timeout, cwd=REPO,
                         env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    if out.returncode != 0:
        raise SystemExit(f"bench_attention: {spec.kernel} on lengths {list(spec.lengths)} "
                         f"(N={spec.max_len}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(spec: Spec, timeout: float) -> dict:
    """{peak_bytes, seconds} of `spec`, each from fresh Python processes:
    - the peak under glibc malloc's defaults (the environment's MALLOC_* settings left out):
      blocks above its mmap threshold are mapped when allocated and unmapped when freed, so
      the peak RSS follows the bytes the kernel holds;
    - with spec.iters > 0, the time in a second process with malloc set as the training ranks
      have it (launch.RANK_MALLOC, the environment's settings winning: large blocks from the
      heap, freed ones kept; under the defaults every run faults in zeroed pages for the
      padded kernel's scores); with iters 0, the memory process's one (cold) run."""
    sys.path.insert(0, str(REPO))
    from dlrmtrain.launch import RANK_MALLOC

    plain_malloc = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    memory = _worker(replace(spec, iters=0), plain_malloc, timeout)
    if spec.iters == 0:
        return memory
    timed = _worker(spec, {**RANK_MALLOC, **os.environ}, timeout)
    return {"peak_bytes": memory["peak_bytes"], "seconds": timed["seconds"]}


def chosen_kernels(args: argparse.Namespace, device: str) -> list[str]:
    """--kernels, or by default padded and blocked, and triton on CUDA (on CPU only with
    --allow-interpreter: Triton's interpreter, tiny sizes)."""
    sys.path.insert(0, str(REPO))
    from dlrmtrain.models.hstu.attention import kinds

    names = [n.strip() for n in (args.kernels or "").split(",") if n.strip()] or \
        [n for n in kinds.KINDS if n != "triton" or device == "cuda"]
    for name in names:
        if name not in kinds.KINDS:
            raise UnknownKernel(f"unknown attention kernel {name!r} (known: {', '.join(kinds.KINDS)})")
        if name == "triton" and device == "cpu" and not args.allow_interpreter:
            raise UnknownKernel("triton on CPU runs under Triton's interpreter: pass --allow-interpreter "
                                "(tiny sizes only)")
    return names


def run_all(args: argparse.Namespace, kernels: list[str], cases: list[Case], device: str) -> dict:
    """{(case, kernel): [worker result per round]}, kernels alternating order each round; a
    case that is another's batch (`fixed` at N = its tokens is `full` at N) runs once a round.
    Each result is printed to stderr as it comes."""
    results: dict = {(c, k): [] for c in cases for k in kernels}
    for r in range(args.rounds):
        done: dict = {}
        for case in cases:
            for kernel in (kernels if r % 2 == 0 else kernels[::-1]):
                spec = Spec(kernel, case.lengths, case.max_len, args.heads, args.width, args.iters, device)
                if spec not in done:
                    done[spec] = got = measure(spec, args.timeout)
                    print(f"round {r + 1}/{args.rounds}: {kernel}, {case.label}: {got['peak_bytes'] / 1e6:,.1f} MB, "
                          f"{statistics.median(got['seconds']):.3f} s", file=sys.stderr, flush=True)
                results[case, kernel].append(done[spec])
    return results


@dataclass
class Cell:
    """One (case, kernel)'s medians over rounds, and their spread."""

    seconds: float
    seconds_min: float
    seconds_max: float
    peak_mb: float
    peak_mb_min: float
    peak_mb_max: float


def summarize(runs: list[dict]) -> Cell:
    seconds = [statistics.median(r["seconds"]) for r in runs]
    peaks = [r["peak_bytes"] / 1e6 for r in runs]
    return Cell(statistics.median(seconds), min(seconds), max(seconds),
                statistics.median(peaks), min(peaks), max(peaks))


def print_table(cells: dict, kernels: list[str], cases: list[Case]) -> None:
    base = kernels[0]
    header = "| case | tokens |" + "".join(f" {k} time s | {k} peak MB |" for k in kernels)
    header += "".join(f" {k}/{base} time | {k}/{base} peak |" for k in kernels[1:])
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for case in cases:
        row = f"| {case.label} | {case.tokens:,} |"
        for k in kernels:
            c = cells[case, k]
            row += (f" {c.seconds:.3f} ({c.seconds_min:.3f}–{c.seconds_max:.3f}) |"
                    f" {c.peak_mb:,.1f} ({c.peak_mb_min:,.1f}–{c.peak_mb_max:,.1f}) |")
        for k in kernels[1:]:
            row += (f" {cells[case, k].seconds / cells[case, base].seconds:.3f} |"
                    f" {cells[case, k].peak_mb / max(cells[case, base].peak_mb, 1e-9):.3f} |")
        print(row)


def goal_lines(cells: dict, kernels: list[str], cases: list[Case]) -> list[str]:
    """The issue's goals, for every kernel beside the first (the baseline), where the cases ran."""
    by = {(c.kind, c.max_len): c for c in cases}
    base, lines = kernels[0], []
    for k in kernels[1:]:
        if ("full", 4096) in by:
            ratio = cells[by["full", 4096], k].peak_mb / cells[by["full", 4096], base].peak_mb
            lines.append(f"{k}: peak at 1 × 4,096 full = {ratio:.3f} of {base}'s (goal ≤ 0.125)")
        if ("two", 2048) in by:
            ratio = cells[by["two", 2048], k].seconds / cells[by["two", 2048], base].seconds
            lines.append(f"{k}: time at 2 × 2,048 (one full, one 30%) = {ratio:.3f} of {base}'s (goal ≤ 0.5)")
    for k in kernels:
        if ("full", 1024) in by and ("full", 4096) in by:
            growth = cells[by["full", 4096], k].peak_mb / cells[by["full", 1024], k].peak_mb
            lines.append(f"{k}: peak growth 1 × 1,024 → 1 × 4,096 full: {growth:.2f}× (goal for a jagged "
                         "kernel ≤ 5×)")
        fixed = [c for c in cases if c.kind == "fixed"]
        if len(fixed) > 1:
            peaks = [cells[c, k].peak_mb for c in fixed]
            lines.append(f"{k}: peak at a fixed {fixed[0].tokens:,} tokens, N {fixed[0].max_len:,} → "
                         f"{fixed[-1].max_len:,}: " + ", ".join(f"{p:,.1f}" for p in peaks)
                         + f" MB (last / first {peaks[-1] / peaks[0]:.2f}×; goal for a jagged kernel: "
                         "not growing)")
    return lines


def machine_line() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    return f"{cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", default=None, help="comma-separated (default: padded,blocked, and triton on CUDA)")
    p.add_argument("--sizes", default="512,1024,2048,4096", help="N values, comma-separated")
    p.add_argument("--fixed-tokens", type=int, default=4096)
    p.add_argument("--cases", default="full,two,fixed", help="which case kinds to run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=2, help="timed runs per process after the first")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128, help="q/k and v widths")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--allow-interpreter", action="store_true", help="run triton on CPU (interpreted)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per worker process")
    p.add_argument("--json", default=None, help="write every cell here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        fields = json.loads(args.worker)
        print(json.dumps(run_worker(Spec(**{**fields, "lengths": tuple(fields["lengths"])}))))
        return 0
    device = args.device
    if device == "auto":  # torch's import is seconds: not for --device cpu
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kernels = chosen_kernels(args, device)
    except UnknownKernel as e:
        raise SystemExit(f"bench_attention: {e}") from None
    kinds = {k.strip() for k in args.cases.split(",")}
    cases = [c for c in make_cases([int(n) for n in args.sizes.split(",")], args.fixed_tokens) if c.kind in kinds]
    print(f"bench_attention: {', '.join(kernels)} on {device}; {args.heads} heads, widths {args.width}, fp32, "
          f"forward + backward; {args.rounds} rounds, median of {args.iters} timed runs each")
    print(f"machine at start: {machine_line()}", flush=True)
    results = run_all(args, kernels, cases, device)
    cells = {key: summarize(runs) for key, runs in results.items()}
    print(f"machine at end: {machine_line()}")
    print_table(cells, kernels, cases)
    for line in goal_lines(cells, kernels, cases):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps([{"case": c.label, "kind": c.kind, "max_len": c.max_len,
                                                "lengths": list(c.lengths), "kernel": k, **asdict(cells[c, k])}
                                               for c in cases for k in kernels], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
