"""dlrmtrain's DLRMv4 against the MLPerf reference's own PyTorch modules, bitwise
(max |diff| = 0), at the timestamps Yambda has: loss, listen_plus logits and every
dense and table gradient, from figures the reference recorded with the same weights
on the same batches (tests/models/golden/README.md says how they were made)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlrmtrain.models.hstu import DlrmHSTU
from tests.models.hstu_golden import (
    GOLDEN_FILE, QUERY_TIMES, golden_batches, golden_config, golden_record, load_golden_weights,
    table_rows)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN_FILE) as f:
        return dict(f)


@pytest.fixture(scope="module")
def figures() -> dict[str, torch.Tensor]:
    """Ours, named as the golden file names them."""
    cfg = golden_config()
    model = DlrmHSTU(cfg.model.hstu, cfg.model.embedding_dim, table_rows(), CPU, CPU)
    load_golden_weights(model)
    model.train()
    out = {}
    for name, batch in golden_batches().items():
        model.zero_grad(set_to_none=True)
        loss, (_, logits, _) = model(batch)
        loss.backward()
        out[f"{name}/loss"], out[f"{name}/logits"] = loss.detach(), logits
        out.update({f"{name}/grad/{n}": p.grad for n, p in model.named_parameters()})
    return out


def _mismatch(key: str, ours: torch.Tensor, golden: dict[str, np.ndarray]) -> str | None:
    """None when ours is the reference's figure bitwise, else how far off it is."""
    kept = golden_record(key, ours)
    if all(np.array_equal(kept[k], golden[k]) for k in kept):
        return None
    sample = f"{key}#sample" if f"{key}#sample" in kept else key
    off = np.abs(kept[sample].astype(np.float64) - golden[sample].astype(np.float64)).max()
    return f"max |diff| {off:.3g}" + (" over the kept sample" if sample != key else "")


def _names(golden: dict[str, np.ndarray], prefix: str) -> set[str]:
    return {k.split("#")[0] for k in golden if k.startswith(prefix)}


@pytest.mark.parametrize("batch", list(QUERY_TIMES))
def test_loss_and_logits_are_the_references_bitwise(golden, figures, batch):
    for what in ("loss", "logits"):
        key = f"{batch}/{what}"
        assert _mismatch(key, figures[key], golden) is None, key


@pytest.mark.parametrize("batch", list(QUERY_TIMES))
def test_every_gradient_is_the_references_bitwise(golden, figures, batch):
    keys = _names(golden, f"{batch}/grad/")
    assert keys == {k for k in figures if k.startswith(f"{batch}/grad/")}
    mismatches = {k: _mismatch(k, figures[k], golden) for k in sorted(keys)}
    assert {k: m for k, m in mismatches.items() if m is not None} == {}
    assert f"{batch}/grad/embedding_collection.embeddings.item_id.weight" in keys  # tables too
