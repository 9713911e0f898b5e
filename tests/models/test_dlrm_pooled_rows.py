"""DLRM's sparse side after the lookup (models/dlrm.py `_pooled_rows`): [B, F, D] in the
model's feature order, viewed where the KeyedTensor already holds that order (dedup at the
source) and reordered where it does not (TorchRec's stock output, grouped by owner rank)."""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedTensor

from dlrmtrain.models.dlrm import _pooled_rows


class _SparseArch:
    sparse_feature_names = ["a", "b", "c"]
    F, D = 3, 2


def _kt(keys: list[str], values: torch.Tensor) -> KeyedTensor:
    return KeyedTensor(keys=keys, length_per_key=[2] * len(keys), values=values)


def test_rows_in_feature_order_are_viewed_and_their_gradient_lands_in_place():
    values = torch.arange(12.0).reshape(2, 6).requires_grad_()
    rows = _pooled_rows(_SparseArch(), _kt(["a", "b", "c"], values))
    assert rows.shape == (2, 3, 2) and rows.data_ptr() == values.data_ptr()  # no copy
    (rows * torch.arange(12.0).reshape(2, 3, 2)).sum().backward()
    assert torch.equal(values.grad, torch.arange(12.0).reshape(2, 6))


def test_rows_grouped_otherwise_are_reordered_into_feature_order():
    values = torch.arange(12.0).reshape(2, 6).requires_grad_()
    rows = _pooled_rows(_SparseArch(), _kt(["b", "a", "c"], values))  # as a rank-grouped output
    assert rows.data_ptr() != values.data_ptr()
    assert torch.equal(rows[0], torch.tensor([[2.0, 3.0], [0.0, 1.0], [4.0, 5.0]]))
    rows.sum().backward()
    assert torch.equal(values.grad, torch.ones(2, 6))
