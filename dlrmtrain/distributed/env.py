"""Process-group lifecycle: one place that starts and tears down torch.distributed.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; a
single process without them runs as a world of one (handy for debugging) on an
in-process store, so two such runs never compete for a port.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(requested: str, local_rank: int) -> torch.device:
    """`auto` means the local GPU when CUDA is available, else the CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("run.device=cuda but no CUDA device is visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(requested)


CUDA_BACKEND = "cpu:gloo,cuda:nccl"
"""The default group's backends on CUDA: NCCL for CUDA tensors, Gloo for CPU tensors."""


def backend_for(device: torch.device) -> str:
    """The default group's backend for a run on `device`.

    On CUDA the group gets both NCCL and Gloo, each serving the tensors of its device
    type: the step's traffic (embedding all-to-alls, DDP's gradients, the loss and AUC
    inputs) lives on the GPU and goes through NCCL; what is kept on the host (the
    comm stats' counters and timings, checkpoint sizes, pickled objects) goes through
    Gloo instead of failing on an NCCL-only group ("No backend type associated with
    device type cpu"). This is what torch itself builds when init_process_group gets
    no backend, and what torchtitan asks for once host-side collectives exist
    (`enable_cpu_backend`); moving every host value to the GPU instead would add a
    copy and a device sync to each, and break again at the next host-side counter.
    Groups from `new_group()` without a backend (comm/topology.py's node and rail
    groups) inherit the pair. Object collectives then pickle through Gloo, so no
    pickle crosses to the GPU.
    """
    return CUDA_BACKEND if device.type == "cuda" else "gloo"


def group_options(device: torch.device) -> dict[str, Any]:
    """`init_process_group`'s backend and, on CUDA, `device_id`: bound to its GPU, NCCL
    creates the default communicator at once and splits the later groups from it
    (ncclCommSplit) instead of creating each lazily inside its first collective."""
    options: dict[str, Any] = {"backend": backend_for(device)}
    if device.type == "cuda":
        options["device_id"] = device
    return options


NCCL_ERROR_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "120",
}
"""How a CUDA rank learns that a peer died or a collective timed out (each one set in the
environment wins). 2 (CleanUpOnly): NCCL's watchdog aborts the communicators of a
failed or timed-out collective and the error reaches the training thread at its next
collective ("NCCL communicator was aborted"), so it ends as a Gloo failure does, named,
exit 3, a `stopped` record (run/peers.py); torch's default 3 (SkipCleanUp) and 1
(TearDown) take the process down from the watchdog thread instead (SIGABRT, no record).
An abort that hangs is what the watchdog's own heartbeat monitor is for: it ends the
process once the watchdog has been stuck for 120 s (torch's default: 480)."""


def nccl_error_env(backend: str) -> dict[str, str]:
    """The settings NCCL_ERROR_ENV adds for a group of `backend`: none without NCCL."""
    if "nccl" not in backend:
        return {}
    return {k: v for k, v in NCCL_ERROR_ENV.items() if k not in os.environ}


def init_distributed(device: str = "auto", timeout_s: float = 300.0) -> DistEnv:
    """Join the process group torchrun prepared (or create a world of one).
    A collective that has not completed after `timeout_s` raises on the ranks
    waiting in it (a frozen or dead peer ends the job instead of hanging it)."""
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = pick_device(device, local_rank)
    options = group_options(dev)
    os.environ.update(nccl_error_env(options["backend"]))  # read when NCCL's group is made
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        if world_size == 1 and "MASTER_PORT" not in os.environ:
            dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout, **options)
        else:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29500")
            dist.init_process_group(rank=rank, world_size=world_size, timeout=timeout,
                                    **options)
    return DistEnv(rank, world_size, local_rank, dev, options["backend"])


def mean_over_ranks(value: torch.Tensor, world_size: int) -> float:
    """Mean of `value` over ranks, in fp32 (a sync point: call only when logging)."""
    value = value.detach().float().clone()
    if world_size > 1:
        dist.all_reduce(value)
        value /= world_size
    return value.item()


def shutdown_distributed(*objects_to_release: object) -> None:
    """Tear down in the order that avoids exit-time aborts.

    A DMP process that only calls destroy_process_group() can die with
    "terminate called without an active exception" (docs/design.md §6): wait for
    every rank, drop the sharded model, collect garbage, then destroy.
    Callers pass nothing and `del` their own references first; the argument
    only documents intent at the call site.
    """
    del objects_to_release
    if not dist.is_initialized():
        return
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()
