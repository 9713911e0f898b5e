"""Which backend would serve each collective of a run on CUDA, recorded on CPU (issue 26).

On a CPU machine every group is Gloo and every tensor a CPU tensor, so NCCL's refusal
("No backend type associated with device type cpu") cannot happen here. A
`CollectiveAudit`, installed on a rank once its default group exists, wraps
torch.distributed's collectives and `new_group` and records, for each call:

- `op` and `site`: the collective and its caller (the first frame outside
  torch.distributed's core), e.g. `dlrmtrain/comm/stats.py:_sum_over_ranks`;
- `phase`: the part of the run it belongs to (setup, train, eval, checkpoint, resume,
  end), read from the stack; a call launched off the main thread names its thread;
- `group` and `backend`: the group (`world` or `group<n>[ranks]`) and its own backend:
  a `new_group`'s `backend=` argument, None for the default group and the groups made
  without one, which inherit the default group's (as torch does; `refusals` is told
  which that is on CUDA);
- `devices`: the device types its tensors would have on CUDA. Object collectives and
  barriers let torch pick the device from the group (the CPU when the group has a CPU
  backend, torch's `_get_object_coll_device`), so the group always serves them. A
  tensor's device on CUDA cannot be seen on CPU: the sites whose tensors are known are
  listed in `HOST_SITES` and `DEVICE_SITES` (read from the code: a tensor made without
  a device stays on the host; the model's, the batch's and anything made with
  `device=` their device go to the GPU); any other call must be served on both.

`refusals(calls, world_backend)` lists every call left with a device type no backend of its
group serves, when the default group (and every group made without a backend) has
`world_backend`: a CPU tensor on an NCCL-only group, a CUDA tensor on a Gloo-only one.
DDP's gradient all-reduce is issued from C++ (its reducer) and is not seen here; its
buckets live on the parameters' device, which the audit records for DDP's start-up
broadcast (`_broadcast_coalesced`).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

TENSOR_OPS = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all", "all_to_all_single",
              "broadcast", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter",
              "send", "recv", "isend", "irecv", "all_gather_coalesced", "all_reduce_coalesced")
HOST_PICKED_OPS = ("barrier", "monitored_barrier", "all_gather_object", "broadcast_object_list",
                   "gather_object", "scatter_object_list", "send_object_list", "recv_object_list")
"""collectives whose tensor torch makes itself, on the device the group's backends suggest"""
CXX_OPS = ("_broadcast_coalesced",)
"""C++ collectives reached through torch.distributed's namespace (the group comes first)"""

HOST_SITES = ("dlrmtrain/comm/stats.py:",)
"""callers whose tensors stay on the host on CUDA: the comm stats' counters and timings,
made with torch.tensor(...) and no device"""
DEVICE_SITES = (
    "torchrec/", "torch/nn/parallel/", "torch/distributed/utils.py:",  # the model's and batch's data
    "dlrmtrain/comm/dedup/", "dlrmtrain/comm/auto/dist.py:_agree",  # ids, rows, flags, timings
    "dlrmtrain/distributed/env.py:mean_over_ranks",         # the window's loss, on the device
    "dlrmtrain/metrics/auc.py:gather_eval_outputs",         # the eval logits, on the device
    "dlrmtrain/run/checkpoint.py:estimate_checkpoint_bytes",  # made with device=env.device
)
"""callers whose tensors are on the GPU on CUDA"""

UNSEEN = "a group made before the audit"
_DEFAULT_DEVICES = {"nccl": ("cuda",), "gloo": ("cpu",)}
_PHASES = {"dlrmtrain/run/checkpoint.py": {"latest_valid": "resume", "load": "resume", "save": "checkpoint"},
           "dlrmtrain/trainer.py": {"evaluate": "eval", "save_checkpoint": "checkpoint", "_stop_clock": "end",
                                    "train_on": "train",
                                    "_record_step": "train", "_start_clock": "train", "__init__": "setup"}}
"""(file, function) of the frame that names a collective's phase; the innermost one wins"""
_CORE = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py",
         "tests/multiproc/collective_audit.py")


def served_devices(backend: str) -> dict[str, str]:
    """Device type → the backend that serves it, for a backend config such as `nccl` or
    `cpu:gloo,cuda:nccl` (a bare name serves its own device type only)."""
    if ":" not in backend:
        return {device: backend for device in _DEFAULT_DEVICES.get(backend, ("cpu",))}
    return dict(pair.split(":") for pair in backend.split(","))


def object_device(backend: str) -> str:
    """The device torch puts an object collective's (or barrier's) tensor on for `backend`:
    the CPU when a backend serves it, else the one device type there is."""
    devices = served_devices(backend)
    return "cpu" if "cpu" in devices or len(devices) != 1 else next(iter(devices))


@dataclass(frozen=True)
class Call:
    op: str
    site: str
    phase: str
    group: str
    backend: Optional[str]
    """the group's own backend (new_group's `backend=`); None: the default group's"""
    devices: tuple[str, ...]
    """device types its tensors would have on CUDA; empty for an object collective or a
    barrier (torch picks the device from the group's backends)"""
    cpu_devices: tuple[str, ...]
    """the device types its tensors have in this (CPU) run"""


def _relative(path: str) -> str:
    path = path.replace("\\", "/")
    for root in ("/torchrec/", "/torch/", "/dlrmtrain/", "/tests/"):
        if root in path:
            return root[1:] + path.split(root, 1)[1]
    return path


def _caller_and_phase(frame: Optional[FrameType]) -> tuple[str, str]:
    """The call's site and phase; a call launched off the main thread (a future's callback)
    has no trainer frame above it: its phase names the thread."""
    site, phase = "", ""
    while frame is not None and not phase:
        rel, function = _relative(frame.f_code.co_filename), frame.f_code.co_name
        if not site and not rel.startswith(_CORE):
            site = f"{rel}:{function}"
        phase = _PHASES.get(rel, {}).get(function, "")
        frame = frame.f_back
    if not phase and threading.current_thread() is not threading.main_thread():
        phase = f"thread {threading.current_thread().name}"
    return site, phase or "outside the trainer"


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def device_on_cuda(site: str) -> tuple[str, ...]:
    """The device types a tensor collective called from `site` hands NCCL on CUDA."""
    if site.startswith(HOST_SITES):
        return ("cpu",)
    if site.startswith(DEVICE_SITES):
        return ("cuda",)
    return ("cpu", "cuda")  # not known: it must be served either way


class CollectiveAudit:
    """Records every collective of this process while installed (see the module docstring)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._groups: dict[int, tuple[str, Optional[str]]] = {}  # id(group) -> (name, own backend)
        self._originals: dict[tuple[Any, str], Any] = {}
        self._depth = threading.local()

    def __enter__(self) -> "CollectiveAudit":
        self._groups[id(c10d._get_default_group())] = ("world", None)
        for name in (*TENSOR_OPS, *HOST_PICKED_OPS):
            self._wrap(name, self._record_call)
        self._wrap("new_group", self._record_group)
        for name in CXX_OPS:
            self._wrap(name, self._record_cxx)
        return self

    def __exit__(self, *exc) -> None:
        for (module, name), original in self._originals.items():
            setattr(module, name, original)
        self._originals.clear()

    def _wrap(self, name: str, record) -> None:
        original = getattr(dist, name)

        def wrapper(*args, **kwargs):
            depth = getattr(self._depth, "value", 0)
            self._depth.value = depth + 1
            try:
                result = original(*args, **kwargs)
            finally:
                self._depth.value = depth
            if depth == 0:  # torch's own nested calls (all_gather_object's all_gather) are its business
                record(name, args, kwargs, result, sys._getframe(1))
            return result

        for module in (dist, c10d):
            if hasattr(module, name):
                self._originals[(module, name)] = getattr(module, name)
                setattr(module, name, wrapper)

    def _group_of(self, group: Optional[dist.ProcessGroup]) -> tuple[str, Optional[str]]:
        if group is None or group is dist.GroupMember.WORLD:
            group = c10d._get_default_group()
        return self._groups.get(id(group), (UNSEEN, None))

    def _record_group(self, name, args, kwargs, group, frame) -> None:
        backend = kwargs.get("backend", args[2] if len(args) > 2 else None)
        ranks = kwargs.get("ranks", args[0] if args else None)
        label = f"group{len(self._groups)}{list(ranks) if ranks is not None else '[all]'}"
        self._groups[id(group)] = (label, str(backend) if backend else None)
        site, phase = _caller_and_phase(frame)
        self.calls.append(Call("new_group", site, phase, label, self._groups[id(group)][1], (), ()))

    def _record_call(self, name, args, kwargs, result, frame) -> None:
        site, phase = _caller_and_phase(frame)
        label, backend = self._group_of(kwargs.get("group"))
        devices = () if name in HOST_PICKED_OPS else device_on_cuda(site)
        cpu = tuple(sorted({t.device.type for t in _tensors([args, list(kwargs.values())])}))
        self.calls.append(Call(name, site, phase, label, backend, devices, cpu))

    def _record_cxx(self, name, args, kwargs, result, frame) -> None:
        site, phase = _caller_and_phase(frame)
        label, backend = self._group_of(args[0] if args else kwargs.get("process_group"))
        cpu = tuple(sorted({t.device.type for t in _tensors(list(args[1:]))}))
        self.calls.append(Call(name, site, phase, label, backend, device_on_cuda(site), cpu))

    def records(self) -> list[dict]:
        return [asdict(c) for c in self.calls]


def refusals(calls: Iterable[dict], world_backend: str) -> list[str]:
    """Why each call would be refused on CUDA when the default group has `world_backend`
    (and the groups made without a backend inherit it): a device type its tensors have
    there that its group's backends do not serve."""
    problems = []
    for call in calls:
        if call["group"] == UNSEEN:
            problems.append(f"{call['site']} ({call['phase']}): {call['op']} on {UNSEEN}: its backend is unknown")
            continue
        backend = call["backend"] or world_backend
        served = served_devices(backend)
        for device in call["devices"] or (object_device(backend),):
            if device not in served:
                problems.append(f"{call['site']} ({call['phase']}): {call['op']} of a {device} tensor "
                                f"on {call['group']}, whose backend on CUDA is {backend!r}")
    return problems
