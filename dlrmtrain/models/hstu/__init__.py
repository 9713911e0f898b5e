"""DLRMv4: the HSTU generative recommender of MLPerf Training v6.1 (`dlrmv4`), on the
Yambda feature layout of `dlrmtrain.sequence_features`. Single-device code; `size`
computes its parameter count and FLOPs from a config."""

from dlrmtrain.models.hstu.model import EMBEDDING_COLLECTION, DlrmHSTU, build_hstu_model

__all__ = ["EMBEDDING_COLLECTION", "DlrmHSTU", "build_hstu_model"]
