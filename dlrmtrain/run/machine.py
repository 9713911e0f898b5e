"""What a rank checks of its own machine before it builds: the device asked for is
there, and the model (its weights and optimizer state) can fit in its memory.

Both would otherwise be found late and as a traceback: a missing GPU by the first
CUDA call, a table of 1e10 rows by the allocator (640 GB asked for). Each raises
SetupError naming the key to change.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

import torch

from dlrmtrain.run.errors import SetupError

if TYPE_CHECKING:
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


def check_model_fits(rows: Mapping[str, int], widths: Mapping[str, int],
                     state: TableOptimizerState, dense_parameters: int,
                     dense_state: DenseOptimizerState, world_size: int, device: torch.device,
                     shrink: str) -> None:
    """Refuse a model whose tables (fp32 weights and fused optimizer state, `state`) spread
    evenly over every rank, plus the dense parameters and their optimizer state that every
    rank holds, cannot fit in this rank's memory (a lower bound: any sharding plan puts at
    least this much on some rank). `shrink`: the keys that make this family's tables smaller."""
    weight_bytes = {name: n * widths[name] * FP32_BYTES for name, n in rows.items()}
    state_bytes = sum(state.values(n, widths[name]) for name, n in rows.items()) * FP32_BYTES
    tables = sum(weight_bytes.values()) + state_bytes
    dense = dense_parameters * (1 + dense_state.per_parameter) * FP32_BYTES
    per_rank = tables / world_size + dense
    free = available_bytes(device)
    if per_rank <= free:
        return
    largest = max(weight_bytes, key=weight_bytes.get)
    with_state = (f" and {_gb(state_bytes / world_size)} for their optimizer state "
                  f"({state.describe()})" if state_bytes else "")
    dense_state_text = (f" with their optimizer state ({dense_state.describe()})"
                        if dense_state.per_parameter else "")
    raise SetupError(
        f"the embedding tables need at least {_gb(sum(weight_bytes.values()) / world_size)} per "
        f"rank for their fp32 weights{with_state}, and every rank holds the "
        f"{dense_parameters:,} dense parameters{dense_state_text}, {_gb(dense)}: {_gb(per_rank)} "
        f"in all ({_gb(tables)} of tables over {world_size} rank(s); the largest, {largest}, has "
        f"{rows[largest]:,} rows × {widths[largest]} = {_gb(weight_bytes[largest])}), but "
        f"{device.type} memory has {_gb(free)} available per rank: {shrink}, or use more ranks"
        + (" (optim.name sgd keeps no optimizer state)" if state_bytes or dense_state.per_parameter else ""))


def _gb(n: float) -> str:
    """GB, or MB / KB for what would read 0.0 GB (a small model's dense parameters)."""
    for unit, scale in (("GB", 2**30), ("MB", 2**20)):
        if n >= scale / 10:
            return f"{n / scale:,.1f} {unit}"
    return f"{n / 2**10:,.1f} KB"
