"""Models, written for a single device; sharding is applied from outside (distributed/)."""

from dlrmtrain.models.dlrm import build_model

__all__ = ["build_model"]
