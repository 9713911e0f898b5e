"""Compiles DLRMv4's Triton attention kernels for a GPU that is not here, and says what a GPU
would get: per kernel and dtype, the tiles, registers and spills (the Triton wheel's own
ptxas -v), shared memory, whether the loop's loads became asynchronous copies (software
pipelining) and whether the products run on tensor cores (wgmma on sm_90).

    PYTHONPATH=. python scripts/compile_attention.py [--arch 90] [--dims 128 128] [--dtype bf16 fp32]

Triton compiles ahead of time without a device (LLVM and ptxas ship in its wheel), so the
code path a GPU runs — `for` loops, native bf16 or IEEE fp32 products, the pipeliner — is
checked on any machine (tests/models/test_hstu_attention_triton.py runs the bf16 case).
Needs torch and triton only; uses Triton's compiler entry points of 3.6 (`triton.compile`,
`ASTSource`, `GPUTarget`).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlrmtrain.models.hstu.attention import triton_kernels as tk  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
POINTER_ARGS = {"_forward_kernel": 4, "_dq_kernel": 5, "_dkdv_kernel": 6}
"""Leading tensor arguments of each kernel (in the inputs' dtype), before offsets and num_targets."""


@dataclass
class Compiled:
    kernel: str
    dtype: str
    tiling: tk.Tiling
    registers: int
    spilled_bytes: int
    shared_bytes: int
    async_copies: int
    tensor_core_ops: int


def _signature(kernel, dtype: str) -> tuple[dict, dict]:
    """Triton's signature and attributes for a launch on contiguous tensors (16-byte aligned
    pointers, as the JIT specialises them)."""
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if i < POINTER_ARGS[kernel.__name__]:
            signature[name] = "*bf16" if dtype == "bf16" else "*fp32"
        elif name in ("offsets", "num_targets"):
            signature[name] = "*i64"
        elif name in ("alpha", "inv_n"):
            signature[name] = "fp32"
        else:
            signature[name] = "constexpr" if name.isupper() else "i32"
        if signature[name].startswith("*"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, attrs


def compile_kernel(kernel, dtype: str, tiling: tk.Tiling, dims: tuple[int, int], arch: int) -> Compiled:
    signature, attrs = _signature(kernel, dtype)
    constants = dict(DIM_QK=dims[0], DIM_V=dims[1], BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n,
                     BLOCK_DQK=max(16, triton.next_power_of_2(dims[0])),
                     BLOCK_DV=max(16, triton.next_power_of_2(dims[1])),
                     DOT="ieee" if dtype == "fp32" else "native", INTERPRETED=False)
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                              options=dict(num_warps=tiling.num_warps, num_stages=tiling.num_stages))
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"  # the "a" features (wgmma) Triton's PTX uses
        log = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={gpu}", str(source), "-o",
                              str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True, check=True).stderr
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    spilled = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    async_copies = ptx.count("cp.async.cg") + ptx.count("cp.async.ca")
    tensor_core_ops = ptx.count("wgmma.mma_async") + ptx.count("mma.sync")
    return Compiled(kernel.__name__, dtype, tiling, registers, spilled, compiled.metadata.shared, async_copies,
                    tensor_core_ops)


def compile_all(dtypes: list[str], dims: tuple[int, int], arch: int) -> list[Compiled]:
    out = []
    for dtype in dtypes:
        tilings = tk.default_tilings(DTYPES[dtype], interpreted=False)
        for kernel, tiling in ((tk._forward_kernel, tilings.forward), (tk._dq_kernel, tilings.dq),
                               (tk._dkdv_kernel, tilings.dkdv)):
            out.append(compile_kernel(kernel, dtype, tiling, dims, arch))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability × 10 (90: H100/H200)")
    parser.add_argument("--dims", type=int, nargs=2, default=(128, 128), metavar=("DQK", "DV"))
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["bf16", "fp32"])
    args = parser.parse_args(argv)
    print(f"triton {triton.__version__}, sm_{args.arch}, widths qk {args.dims[0]} v {args.dims[1]}")
    print("| kernel | dtype | tiles (m × n, warps, stages) | registers | spilled bytes | shared KiB "
          "| async copies | tensor-core ops |")
    print("|---|---|---|---|---|---|---|---|")
    for c in compile_all(args.dtype, tuple(args.dims), args.arch):
        t = c.tiling
        print(f"| {c.kernel} | {c.dtype} | {t.block_m} × {t.block_n}, {t.num_warps}, {t.num_stages} | {c.registers} "
              f"| {c.spilled_bytes} | {c.shared_bytes / 1024:.0f} | {c.async_copies} | {c.tensor_core_ops} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
