"""The DLRMv4 model end to end on tiny hand-made batches, single process."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.models.hstu import DlrmHSTU, build_hstu_model
from dlrmtrain.models.hstu.tables import hstu_table_rows
from dlrmtrain.sequence_features import TABLES
from dlrmtrain.workloads import build_model
from tests.models.hstu_batches import make_batch, random_batch, tiny_hstu_config

CPU = torch.device("cpu")


def _model(*overrides: str) -> DlrmHSTU:
    return build_hstu_model(tiny_hstu_config(*overrides), CPU, table_device=CPU)


def test_forward_returns_loss_logits_and_listen_plus_labels_like_dlrm_train():
    model = _model()
    # candidate bits: 1 = listen_plus, 4 = skip, 3 = listen_plus + like
    batch = make_batch(histories=[[(1, 1, 1, 1, 100), (2, 2, 2, 4, 200)], [], [(5, 3, 4, 2, 50)]],
                       candidates=[(3, 1, 1, 1, 300), (4, 2, 2, 4, 10), (6, 3, 3, 3, 99)],
                       users=[7, 8, 9])
    loss, (loss_detached, logits, labels) = model(batch)
    assert logits.shape == (3,) and not logits.requires_grad
    assert torch.equal(labels, torch.tensor([1.0, 0.0, 1.0]))
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    torch.testing.assert_close(loss.detach(), 0.2 * bce)   # × the reference's task weight
    assert loss_detached.item() == loss.item() and loss.requires_grad


def test_every_dense_parameter_and_used_table_gets_a_gradient():
    model = _model("model.hstu.input_dropout=0", "model.hstu.linear_dropout=0")
    batch = random_batch(torch.Generator().manual_seed(0), batch_size=4, max_history=6, min_history=1)
    loss, _ = model(batch)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_tiny_model_learns_a_hand_made_task():
    """Label: listen_plus when the candidate item is even; trained on one batch (tables
    and dense layers by Adam), the loss falls to under half of where it started."""
    torch.manual_seed(0)
    model = _model()
    gen = torch.Generator().manual_seed(3)
    train = random_batch(gen, batch_size=64, max_history=10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        loss, _ = model(train)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
    model.eval()
    with torch.no_grad():
        final, _ = model(train)
    assert final.item() < 0.5 * first, (first, final.item())


def test_sequences_longer_than_max_seq_len_are_refused():
    model = _model("model.hstu.max_seq_len=14")   # 8 contextual + 5 history + 1 candidate = 14
    gen = torch.Generator().manual_seed(0)
    model(random_batch(gen, batch_size=2, max_history=5, min_history=5))
    with pytest.raises(ValueError, match="exceeds model.hstu.max_seq_len 14"):
        model(random_batch(gen, batch_size=2, max_history=6, min_history=6))


def test_build_model_dispatches_on_arch_with_meta_tables():
    cfg = tiny_hstu_config()
    model = build_model(cfg, None, CPU)
    assert isinstance(model, DlrmHSTU)
    tables = model.embedding_collection.embeddings
    assert list(tables) == list(TABLES)
    for name, emb in tables.items():
        assert emb.weight.device.type == "meta"
        assert emb.weight.shape == (hstu_table_rows(50)[name], 8)
    dense = [p for n, p in model.named_parameters() if not n.startswith("embedding_collection")]
    assert all(p.device.type == "cpu" for p in dense)
    # the same seed gives the same dense weights (every rank builds the same model)
    again = build_model(cfg, None, CPU)
    for (n, a), b in zip(model.named_parameters(), again.parameters()):
        if not n.startswith("embedding_collection"):
            assert torch.equal(a, b), n
