"""Exact ROC AUC over every evaluation sample, gathered from all ranks.

AUC is the Mann–Whitney statistic: the probability that a random positive
scores above a random negative, ties counting one half. Computed from average
ranks in float64, so it is exact (no histogram binning) and tie-correct.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Iterable

import torch
import torch.distributed as dist


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact AUC of `scores` for binary `labels` (1 = positive)."""
    scores = scores.detach().reshape(-1).to(torch.float64)
    positive = labels.detach().reshape(-1) > 0.5
    n = scores.numel()
    num_pos = int(positive.sum())
    num_neg = n - num_pos
    if num_pos == 0 or num_neg == 0:
        raise ValueError(f"AUC needs both classes; got {num_pos} positives, {num_neg} negatives")
    sorted_scores, order = torch.sort(scores, stable=True)
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True,
                                                  return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)        # 1-based rank of each tie group's last
    average_rank = ends - (counts.to(torch.float64) - 1.0) / 2.0
    rank_sum = average_rank[inverse][positive[order]].sum().item()
    return (rank_sum - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg)


def gather_eval_outputs(scores: torch.Tensor, labels: torch.Tensor,
                        weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All ranks' (scores, labels) with padding (weight 0) removed, on every rank.

    Every rank holds the same number of entries (eval batches are padded to equal
    per-rank slices), so a plain all_gather suffices.
    """
    stacked = torch.stack([scores.float(), labels.float(), weights.float()])
    if dist.is_initialized() and dist.get_world_size() > 1:
        parts = [torch.empty_like(stacked) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, stacked)
        stacked = torch.cat(parts, dim=1)
    keep = stacked[2] > 0
    return stacked[0][keep], stacked[1][keep]


@torch.no_grad()
def evaluate_auc(model: torch.nn.Module, batches: Iterable, device: torch.device,
                 autocast: Callable[[], ContextManager], before_batch: Callable[[], None]
                 ) -> tuple[float, int]:
    """Exact AUC of `model` over every rank's weighted eval `batches` (each rank gets the
    same value) and the number of samples; `before_batch()` runs before each batch."""
    model.eval()
    scores, labels, weights = [], [], []
    for batch, weight in batches:
        before_batch()
        with autocast():
            _, (_, logits, batch_labels) = model(batch.to(device))
        scores.append(logits.float())  # fp32 already: models compute logits in fp32 (precision.py)
        labels.append(batch_labels.float())
        weights.append(weight.to(device))
    model.train()  # a pipeline re-attaches itself on its next step
    all_scores, all_labels = gather_eval_outputs(torch.cat(scores), torch.cat(labels),
                                                 torch.cat(weights))
    return roc_auc(all_scores, all_labels), all_scores.numel()
