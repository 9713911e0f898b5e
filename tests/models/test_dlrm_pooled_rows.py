"""DLRM's sparse side after the lookup (models/dlrm.py `_pooled_rows`): [B, F, D] in the
model's feature order, viewed where the KeyedTensor already holds that order (dedup at the
source) and reordered where it does not (TorchRec's stock output, grouped by owner rank)."""

from __future__ import annotations

import pytest
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


def _interactions(F: int, D: int) -> list[torch.nn.Module]:
    from torchrec.models.dlrm import InteractionArch, InteractionDCNArch
    from torchrec.modules.crossnet import LowRankCrossNet

    torch.manual_seed(0)
    return [InteractionArch(num_sparse_features=F),
            InteractionDCNArch(num_sparse_features=F,
                               crossnet=LowRankCrossNet(in_features=(F + 1) * D, num_layers=2, low_rank=3))]


def test_interact_from_the_concatenation_is_torchrecs_interaction_bitwise():
    """`_interact` repeats torchrec's two interactions after their concatenation: same output."""
    from dlrmtrain.models.dlrm import _interact

    B, F, D = 16, 3, 4
    dense, sparse = torch.randn(B, D), torch.randn(B, F, D)
    for arch in _interactions(F, D):
        combined = torch.cat((dense.unsqueeze(1), sparse), dim=1)
        assert torch.equal(_interact(arch, dense, combined), arch(dense, sparse)), type(arch).__name__


@pytest.mark.parametrize("shards", [1, 2])
def test_dense_and_pooled_rows_are_gathered_in_one_op_at_the_source_and_interact_as_before(shards):
    """Dedup at the source (`ExpandedRows`, the rows not yet expanded): the interaction's input is
    one gather of the dense and pooled rows, and the interaction's output and gradients are
    bitwise those of the expand + `_pooled_rows` + torchrec's interaction; the expanded values
    are never made (column-wise too: each feature's row in `shards` column shards). A plain
    KeyedTensor, or a model in another feature order, takes the old path."""
    from dlrmtrain.comm.torchrec.pooled_source import ExpandedRows
    from dlrmtrain.models.dlrm import _dense_and_pooled_rows, _interact

    B, F, D, U = 16, 3, 2, 7
    index = torch.randint(0, U, (B, F * shards), generator=torch.Generator().manual_seed(1))
    for arch in _interactions(F, D):
        dlrm = torch.nn.Module()
        dlrm.sparse_arch, dlrm.inter_arch = _SparseArch(), arch
        results = []
        for fused in (False, True):
            rows = torch.randn(U, D // shards, generator=torch.Generator().manual_seed(2)).requires_grad_()
            dense = torch.randn(B, D, generator=torch.Generator().manual_seed(3)).requires_grad_()
            kt = ExpandedRows(["a", "b", "c"], [D] * F, rows, lambda offset: index + offset, index.shape)
            if fused:
                combined = _dense_and_pooled_rows(dlrm, kt, dense)
                out = _interact(arch, dense, combined)
                assert kt._expanded is None  # the B·F·D expand never made
            else:
                out = arch(dense, _pooled_rows(dlrm.sparse_arch, kt))
            out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(4)))
            results.append((out.detach(), dense.grad, rows.grad))
        for old, new in zip(*results):
            assert torch.equal(old, new), type(arch).__name__
        dense = torch.randn(B, D)
        assert _dense_and_pooled_rows(dlrm, _kt(["a", "b", "c"], torch.randn(B, F * D)), dense) is None
        assert _dense_and_pooled_rows(dlrm, ExpandedRows(["b", "a", "c"], [D] * F, torch.randn(U, D // shards),
                                                                   lambda offset: index + offset, index.shape),
                                      dense) is None


def test_the_interaction_asks_any_rows_behind_output_and_waits_for_an_awaitable_first():
    """models/dlrm.py knows the lookup's output through `rows_behind.RowsBehind` alone: an output
    declaring it (a toy here, not comm's) is asked for its rows behind the dense row, once, and
    gives the same logits as a plain KeyedTensor of the same values; one with a `behind` it does
    not declare is not asked; the sharded EBC's output, an `Awaitable` in flight, is waited for
    first."""
    from torchrec.distributed.types import LazyAwaitable
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from dlrmtrain.models.dlrm import SparseFirstDLRM
    from dlrmtrain.rows_behind import RowsBehind

    class ToyRows(KeyedTensor, RowsBehind):
        asked = 0

        def behind(self, leading):
            ToyRows.asked += 1
            return torch.cat((leading.unsqueeze(1), self.values().view(leading.size(0), -1, leading.size(1))), 1)

    class Undeclared(KeyedTensor):
        def behind(self, leading):
            raise AssertionError("asked without declaring RowsBehind")

    class InFlight(LazyAwaitable):
        def __init__(self, rows):
            super().__init__()
            self.rows = rows

        def _wait_impl(self):
            return self.rows

    class Lookup(torch.nn.Module):
        def __init__(self, output):
            super().__init__()
            self.output = output

        def forward(self, _features):
            return self.output

    B, D, names = 4, 2, ["a", "b", "c"]
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t_{n}", embedding_dim=D, num_embeddings=5,
                                                            feature_names=[n]) for n in names])
    model = SparseFirstDLRM(embedding_bag_collection=ebc, dense_in_features=3, dense_arch_layer_sizes=[D],
                            over_arch_layer_sizes=[3, 1])
    dense, values = torch.randn(B, 3), torch.randn(B, len(names) * D)
    logits = []
    for output in (KeyedTensor(names, [D] * 3, values), InFlight(ToyRows(names, [D] * 3, values)),
                   Undeclared(names, [D] * 3, values)):
        model.sparse_arch.embedding_bag_collection = Lookup(output)
        logits.append(model(dense, None))
    assert ToyRows.asked == 1
    assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])
