"""Exact AUC against an independent Mann–Whitney count, ties included, and across ranks."""

from __future__ import annotations

import itertools

import pytest
import torch

from dlrmtrain.metrics.auc import gather_eval_outputs, roc_auc
from tests.multiproc import run_ranks


def mann_whitney_auc(scores: list[float], labels: list[int]) -> float:
    """O(P·N) pair count: 1 per positive above a negative, 1/2 per tie."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed, levels", [(0, None), (1, 5), (2, 2), (3, 1)])
def test_matches_pair_count(seed, levels):
    g = torch.Generator().manual_seed(seed)
    n = 700
    labels = (torch.rand(n, generator=g) < 0.3).long()
    scores = torch.rand(n, generator=g) + 0.3 * labels
    if levels is not None:  # heavy ties: few distinct scores (levels=1: all tied → 0.5)
        scores = torch.floor(scores * levels) / levels
    expected = mann_whitney_auc(scores.tolist(), labels.tolist())
    assert roc_auc(scores, labels) == pytest.approx(expected, abs=1e-12)


def test_perfect_and_inverted():
    labels = torch.tensor([0, 0, 1, 1])
    assert roc_auc(torch.tensor([0.1, 0.2, 0.3, 0.4]), labels) == 1.0
    assert roc_auc(torch.tensor([0.4, 0.3, 0.2, 0.1]), labels) == 0.0


def test_one_class_is_an_error():
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))


def _gathered_auc(rank, world_size, scores, labels, weights):
    mine = slice(rank * 4, rank * 4 + 4)
    s, y = gather_eval_outputs(scores[mine], labels[mine], weights[mine])
    return roc_auc(s, y), s.numel()


def test_gathered_auc_ignores_padding_and_equals_single_process():
    scores = torch.tensor([0.9, 0.1, 0.4, 0.8, 0.35, 0.7, 0.2, 0.05, 0.6, 0.3, 0.99, 0.0])
    labels = torch.tensor([1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0])
    weights = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0])  # last two are padding
    results = run_ranks(_gathered_auc, 3, scores, labels, weights, timeout=120)
    expected = mann_whitney_auc(scores[:10].tolist(), labels[:10].tolist())
    assert all(auc == pytest.approx(expected, abs=1e-12) and n == 10 for auc, n in results)
