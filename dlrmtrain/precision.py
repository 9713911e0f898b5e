"""Numeric precision of a training step, in one place.

| mode | dense MLPs & interaction | embedding tables, optimizer state | embedding all-to-all |
|------|--------------------------|-----------------------------------|----------------------|
| fp32 | fp32                     | fp32                              | fp32                 |
| bf16 | bf16 autocast (weights and their grads stay fp32) | fp32     | bf16 on every device: the GPU lookup emits bf16; fbgemm's CPU lookup cannot, so its fp32 output is rounded once to bf16 after the kernel (comm/torchrec/kernels.emit_rows_in), the same value |

Where the bf16 embedding all-to-all rounds (GPU and CPU alike):

| step | `none` | `dedup` |
|------|--------|---------|
| lookup | fbgemm's TBE sums a bag's fp32 rows in fp32, rounds once to bf16 (CPU: the kernel's fp32 output rounded once) | the same lookup |
| forward wire | each bag's bf16 row | each unique bag's bf16 row: the output is `none`'s, bitwise |
| backward, receiver | each bag's bf16 gradient is sent as is | a unique bag's repeats summed in fp32 (`dedup/kernels.segment_sum_rows`), rounded once to bf16 and sent |
| backward, owner | TorchRec divides by the world size in bf16 (exact for a power of two) | the same division (`dedup/transport.owner_gradient`), the sum at the bag's first occurrence, zeros elsewhere |
| embedding backward | the TBE sums a row's bag gradients in fp32 (fbgemm's `grad_sum` accumulator) and updates fp32 weights | the same TBE, same fp32 sum |

So `dedup`'s row gradient is `none`'s up to one bf16 rounding of each repeated
bag's gradient sum (|error| <= 2**-8 of that sum) and fp32 summation order;
a bag that does not repeat crosses as the same bf16 bytes. Sending the sums in
fp32 would not remove that rounding: autograd casts a gradient to its
forward output's dtype, so the TBE receives bf16 either way. Two levels
(`comm.hierarchy: node`) round twice: the rank's sum, then the forwarder's sum
over its node's ranks (`dedup/two_level/transport.py`), each accumulated in fp32.
A lossy codec (`fp16`, `bf16`, `int8`, `fp8`, `dedup+fp16`, `dedup+bf16`) on bf16 rows
is refused by name (comm/codec_choice.validate_wire_precision): it would round the bf16
row a second time instead of once from the fp32 sum. DLRMv4's rows stay fp32 under
bf16 (below), so its reference wire `dedup+fp16` rounds once, from fp32.

The loss (BCE with logits) is computed in fp32 under autocast. What the bf16 row
means per model family (under fp32 everything is fp32):

| family | bf16 autocast | fp32 |
|--------|---------------|------|
| DLRM v1, DCNv2 | bottom MLP, interaction, top MLP up to its last layer | the logit layer (top MLP's last Linear), so eval scores and the AUC are fp32 |
| DLRMv4 (HSTU) | the user tower only, as the reference's `_user_forward`: preprocessor, positions, STU layers, postprocessor (layer norms in fp32; time buckets and hour/day features in fp32 from the int64 timestamps) | item MLP, prediction head, logits (the reference's head autocast is gated on a dtype flag it never sets); the embedding all-to-all (the reference's tables emit fp32; a lossy wire is a codec, e.g. `dedup+fp16`) |

The trainer wraps a DLRM forward in `autocast`; DLRMv4's model scopes its own (the
user tower only), so the trainer runs it outside any autocast. fp16 is not offered:
it needs loss scaling, and TorchRec's fused embedding optimizers update the tables
inside the backward pass, before a scaler could unscale the gradient or skip a step
with inf/NaN; bf16 has fp32's range and needs no scaling, so it is the
mixed-precision mode on CPU and GPU alike.

A CPU without bf16 instructions (x86 before avx512_bf16 / AMX, e.g. an AVX2 EPYC) runs
bf16 matmuls emulated, an order of magnitude slower than fp32 (17x measured on an
AVX2 EPYC at 512x512, one thread): `emulated_bf16_note` says so once at start.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterable, Optional

import torch
from fbgemm_gpu.split_embedding_configs import SparseType

def autocast(mode: str, device: torch.device, model_scopes_its_own: bool = False):
    """The context the trainer runs a forward (training and evaluation) in;
    `model_scopes_its_own`: the family's (Workload.model_scopes_its_own_autocast)."""
    if mode == "bf16" and not model_scopes_its_own:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def embedding_output_dtype(mode: str, device_type: str) -> SparseType:
    """What the fused lookup emits, hence what the embedding all-to-all carries: bf16 under
    bf16 on every device (on CPU fbgemm computes fp32 and it is rounded once to bf16 after the
    lookup: comm/torchrec/kernels.emit_rows_in)."""
    return SparseType.BF16 if mode == "bf16" else SparseType.FP32


NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""/proc/cpuinfo flags of a CPU with bf16 instructions (x86: avx512_bf16, AMX; arm64: bf16)."""
NO_BF16_CAPABILITIES = frozenset({"DEFAULT", "AVX2"})
"""torch.backends.cpu.get_cpu_capability() answers that rule bf16 instructions out."""


def cpu_flags(path: str = "/proc/cpuinfo") -> Optional[frozenset[str]]:
    """The CPU's feature flags as Linux lists them (x86 `flags`, arm64 `Features`); None
    where the file is not there (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        return None
    return frozenset()


def cpu_has_native_bf16(flags: Optional[Iterable[str]], capability: str) -> Optional[bool]:
    """Whether this CPU computes bf16 in hardware: its flags where Linux lists them, else
    torch's vector capability (AVX2 or none rules it out); None: cannot tell."""
    if flags is not None:
        return bool(NATIVE_BF16_FLAGS & set(flags))
    return False if capability in NO_BF16_CAPABILITIES else None


def bf16_matmul_slowdown(n: int = 256, repeats: int = 5) -> float:
    """How many times slower an n x n bf16 matmul runs than fp32's here (best of `repeats`,
    one thread: two threads on a loaded machine wait on each other more than they compute)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    best, threads = {}, torch.get_num_threads()
    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y  # warm-up: first-call dispatch and allocation
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        best[dtype] = min(times)
    torch.set_num_threads(threads)
    return best[torch.bfloat16] / max(best[torch.float32], 1e-9)


def emulated_bf16_note(mode: str, device_type: str, cpuinfo: str = "/proc/cpuinfo",
                       capability: Optional[str] = None,
                       slowdown: Callable[[], float] = bf16_matmul_slowdown) -> Optional[str]:
    """One line for the start of a run: `precision.mode: bf16` on a CPU that would emulate
    bf16 matmuls, with the slowdown measured here; None otherwise (fp32, a GPU, a CPU with
    bf16 instructions, or one that cannot be told). `capability`: torch's unless given."""
    if mode != "bf16" or device_type != "cpu":
        return None
    capability = capability or torch.backends.cpu.get_cpu_capability()
    flags = cpu_flags(cpuinfo)
    if cpu_has_native_bf16(flags, capability) is not False:
        return None
    how = ("no avx512_bf16, amx_bf16 or bf16 in /proc/cpuinfo's flags" if flags is not None
           else f"torch's CPU capability {capability}")
    return (f"note: precision.mode=bf16 on a CPU without bf16 instructions ({capability}; {how}): "
            f"bf16 matmuls are emulated, ~{slowdown():.0f}x slower than fp32 as measured here "
            f"(256x256, one thread), so the dense part runs slower than under fp32. For speed on "
            f"this machine use precision.mode=fp32; bf16 pays on a GPU or a CPU with "
            f"avx512_bf16 or AMX.")
