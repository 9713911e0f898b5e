"""What a rank checks of its own machine before it builds: the device asked for is
there, and the model can fit in its memory: the tables with their optimizer state, the
dense parameters with their gradients and state, and a training step's activations.

Each would otherwise be found late and as a traceback: a missing GPU by the first
CUDA call, a table of 1e10 rows by the allocator (640 GB asked for), DLRMv4's padded
attention at its MLPerf size by the first step (~1 TB of [B, H, N, N] scores). Each
raises SetupError in one line naming what does not fit and the key to change. What the
parts are is each family's (its Workload says, workloads/base.py): this module only adds
them up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

import torch

from dlrmtrain.run.errors import SetupError

if TYPE_CHECKING:
    from dlrmtrain.models.activation_memory import ActivationMemory
    from dlrmtrain.optim.state_size import DenseOptimizerState, TableOptimizerState

FP32_BYTES = 4


def check_device(requested: str) -> None:
    """run.device=cuda needs a visible CUDA device on this machine."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise SetupError("run.device=cuda: no CUDA device is visible on this machine "
                         "(CUDA_VISIBLE_DEVICES, driver); use run.device=cpu or auto")


def available_bytes(device: torch.device) -> int:
    """Memory this rank may still use: the GPU's free memory, or this machine's available
    memory shared by its ranks (LOCAL_WORLD_SIZE)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        total = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):  # not Linux: what the OS says is free
        total = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return total // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


@dataclass(frozen=True)
class MemoryPart:
    """One part of what a rank needs, as the refusal names it."""

    name: str
    """How the list of the other parts names it: "the dense parameters"."""
    nbytes: int
    """Bytes on every rank (the tables: their share of an even spread, a lower bound)."""
    lead: str
    """The refusal's opening when this part is the largest, its size and what it holds."""
    advice: str
    """What makes it smaller, as the refusal ends."""


def table_part(rows: Mapping[str, int], widths: Mapping[str, int], state: TableOptimizerState,
               world_size: int, shrink: str, cached: Optional[Mapping[str, float]] = None) -> MemoryPart:
    """The tables' fp32 weights and fused optimizer state (`state`) spread evenly over every
    rank: a lower bound, any sharding plan puts at least this much on some rank. `shrink`: the
    keys that make the family's tables smaller; `cached`: UVM-cached table → the share of its
    rows its GPU cache holds (the rest, and a per-weight state, live in host memory)."""
    cached = cached or {}
    weight_bytes = {name: n * widths[name] * FP32_BYTES for name, n in rows.items()}
    on_gpu = sum(b * cached.get(name, 1.0) for name, b in weight_bytes.items())
    state_bytes = FP32_BYTES * sum(state.values(n, widths[name]) if name not in cached
                                   else state.values(n, 0) for name, n in rows.items())
    largest = max(weight_bytes, key=weight_bytes.get)
    with_state = (f" and {_gb(state_bytes / world_size)} for their optimizer state "
                  f"({state.describe()})" if state_bytes else "")
    uvm = f", {len(cached)} of them UVM-cached (sharding.uvm_caching)" if cached else ""
    lead = (f"the embedding tables need at least {_gb(on_gpu / world_size)} per rank for their "
            f"fp32 weights{with_state}: {_gb(sum(weight_bytes.values()) + state_bytes)} of tables "
            f"over {world_size} rank(s){uvm}, the largest, {largest}, has {rows[largest]:,} rows × "
            f"{widths[largest]} = {_gb(weight_bytes[largest])}")
    return MemoryPart("the embedding tables", int(on_gpu + state_bytes) // world_size, lead,
                      f"{shrink}, or use more ranks" + (" (optim.name sgd keeps no optimizer state)"
                                                        if state_bytes else ""))


def dense_part(dense_parameters: int, dense_state: DenseOptimizerState) -> MemoryPart:
    """The dense parameters every rank holds, with their gradients (DDP's bucket views) and
    the dense optimizer's state."""
    nbytes = dense_parameters * (2 + dense_state.per_parameter) * FP32_BYTES
    state = f" and optimizer state ({dense_state.describe()})" if dense_state.per_parameter else ""
    return MemoryPart("the dense parameters", nbytes,
                      f"every rank holds the {dense_parameters:,} dense parameters with their gradients"
                      f"{state}, {_gb(nbytes)}",
                      "use a smaller model" + (" or optim.name sgd (no optimizer state)" if state else ""))


def activation_part(activations: ActivationMemory) -> MemoryPart:
    """A training step's activations (the family's model of them), led by their largest part."""
    largest = activations.largest()
    holds = f"{largest.holds}; " if largest.holds else ""
    lead = (f"{largest.name} needs {_gb(largest.peak)} per rank at {activations.shape} "
            f"({holds}{_gb(activations.peak)} of activations in all)")
    return MemoryPart("the activations", activations.peak, lead,
                      largest.advice or "use a smaller run.global_batch_size")


def check_model_fits(parts: Sequence[MemoryPart], device: torch.device,
                     available: Optional[int] = None) -> None:
    """Refuse, in one line naming the largest part and by how much the whole is over, a rank
    whose `parts` cannot fit in the memory `available` to it (default: what this machine
    says, available_bytes)."""
    free = available_bytes(device) if available is None else available
    total = sum(p.nbytes for p in parts)
    if total <= free:
        return
    culprit = max(parts, key=lambda p: p.nbytes)
    others = [f"{p.name} ({_gb(p.nbytes)})" for p in parts if p is not culprit]
    beside = (f"with {', '.join(others[:-1])} and {others[-1]}" if len(others) > 1
              else f"with {others[0]}" if others else "alone")
    raise SetupError(
        f"{culprit.lead}; {beside} a rank needs {_gb(total)}, but {device.type} memory has "
        f"{_gb(free)} available per rank ({_gb(total - free)} too much): {culprit.advice}")


def _gb(n: float) -> str:
    """GB, or MB / KB for what would read 0.0 GB (a small model's dense parameters)."""
    from dlrmtrain.models.activation_memory import gib  # the one formatter; models/ only when refusing

    return gib(n)
