"""DLRMv4: the HSTU generative recommender of MLPerf Training v6.1 (`dlrmv4`), on the
Yambda feature layout of `dlrmtrain.sequence_features`. Single-device code; `size`
computes its parameter count and FLOPs from a config.

The model's names are loaded on first use (PEP 562): the model needs TorchRec, while its
torch-only parts (`jagged`, `attention`) must import on a machine with torch alone (a lent
GPU machine; scripts/gpu_check_attention.py)."""

from __future__ import annotations

__all__ = ["EMBEDDING_COLLECTION", "DlrmHSTU", "build_hstu_model"]


def __getattr__(name: str):
    if name in __all__:
        from dlrmtrain.models.hstu import model
        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
