"""Models, written for a single device; sharding is applied from outside (distributed/)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import torch
from torch import nn

from dlrmtrain.config.schema import Config
from dlrmtrain.models.dlrm import build_model as build_dlrm_model
from dlrmtrain.models.hstu import build_hstu_model


def build_model(cfg: Config, rows: Union[Sequence[int], Mapping[str, int], None],
                dense_device: torch.device) -> nn.Module:
    """The training module for `model.arch` (forward(batch) → (loss, (loss, logits, labels))),
    tables on the meta device. `rows`: DLRM: one entry per table in feature order;
    `dlrmv4_hstu`: table name → rows, or None for the reference's capped at model.max_table_rows."""
    if cfg.model.arch == "dlrmv4_hstu":
        if rows is not None and not isinstance(rows, Mapping):
            raise TypeError("dlrmv4_hstu takes its table rows as {table name: rows} (or None)")
        return build_hstu_model(cfg, dense_device, rows)
    return build_dlrm_model(cfg, list(rows), dense_device)


__all__ = ["build_model"]
