"""Models, written for a single device; sharding is applied from outside (distributed/).

One builder per family, tables on the meta device: `build_dlrm_model` (dlrm.py: dlrm_v1,
dlrm_dcnv2) and `build_hstu_model` (hstu/: dlrmv4_hstu). Which one a config runs is its
workload's choice (dlrmtrain/workloads/).

Both builders are loaded on first use (PEP 562): they need TorchRec, which the torch-only
modules below this package (hstu.jagged, hstu.attention) must not.
"""

from __future__ import annotations

__all__ = ["build_dlrm_model", "build_hstu_model"]


def __getattr__(name: str):
    if name == "build_dlrm_model":
        from dlrmtrain.models.dlrm import build_model
        return build_model
    if name == "build_hstu_model":
        from dlrmtrain.models.hstu.model import build_hstu_model
        return build_hstu_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
