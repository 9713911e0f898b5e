"""What a rank checks of its own machine before it builds: the device asked for is
there, and the embedding tables can fit in its memory.

Both would otherwise be found late and as a traceback: a missing GPU by the first
CUDA call, a table of 1e10 rows by the allocator (640 GB asked for). Each raises
SetupError naming the key to change.
"""

from __future__ import annotations

import os
from typing import Mapping

import torch

from dlrmtrain.run.errors import SetupError

FP32_BYTES = 4
FLAT_TABLE_ARCHS = ("dlrm_v1", "dlrm_dcnv2")
"""Models whose every table is model.embedding_dim wide (the check below needs the widths)."""


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


def check_tables_fit(rows: Mapping[str, int], dim: int, world_size: int,
                     device: torch.device) -> None:
    """Refuse tables whose fp32 weights cannot fit even spread evenly over every rank
    (a lower bound: any sharding plan puts at least this much on some rank)."""
    table_bytes = {name: n * dim * FP32_BYTES for name, n in rows.items()}
    per_rank = sum(table_bytes.values()) / world_size
    free = available_bytes(device)
    if per_rank <= free:
        return
    largest = max(table_bytes, key=table_bytes.get)
    raise SetupError(
        f"the embedding tables need at least {_gb(per_rank)} per rank ({_gb(sum(table_bytes.values()))} "
        f"over {world_size} rank(s); the largest, {largest}, has {rows[largest]:,} rows × {dim} "
        f"= {_gb(table_bytes[largest])}), but {device.type} memory has {_gb(free)} available "
        f"per rank: lower data.table_sizes (or cap them with model.max_table_rows), or use "
        f"more ranks")


def _gb(n: float) -> str:
    return f"{n / 2**30:,.1f} GB"
