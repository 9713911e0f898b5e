"""Models, written for a single device; sharding is applied from outside (distributed/).

One builder per family, tables on the meta device: `build_dlrm_model` (dlrm.py: dlrm_v1,
dlrm_dcnv2) and `build_hstu_model` (hstu/: dlrmv4_hstu). Which one a config runs is its
workload's choice (dlrmtrain/workloads/).
"""

from __future__ import annotations

from dlrmtrain.models.dlrm import build_model as build_dlrm_model
from dlrmtrain.models.hstu import build_hstu_model

__all__ = ["build_dlrm_model", "build_hstu_model"]
