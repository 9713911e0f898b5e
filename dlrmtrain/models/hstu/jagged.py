"""Jagged sequences: a batch's rows stored back to back, `values[offsets[b]:offsets[b+1]]`
being sample b's sequence.

The padded conversions are fbgemm's (they have CPU and GPU kernels and autograd);
concatenating and splitting two jagged batches per sample is an index permutation
in plain torch (no padding, so no [B, N, D] buffer).
"""

from __future__ import annotations

import torch

# fbgemm's jagged operators (torch.ops.fbgemm.*) are registered on import.
import fbgemm_gpu  # noqa: F401


def offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    """[B] lengths → [B + 1] offsets, starting at 0."""
    return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)


def to_padded(values: torch.Tensor, offsets: torch.Tensor, max_len: int,
              padding_value: float = 0.0) -> torch.Tensor:
    """[L, D] jagged → [B, max_len, D], zero past each sample's length."""
    return torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [max_len], padding_value)


def to_jagged(padded: torch.Tensor, offsets: torch.Tensor, total: int) -> torch.Tensor:
    """[B, N, D] padded → [total, D]: each sample's first length rows, back to back
    (`total` = offsets[-1], passed in so that no host sync is needed)."""
    return torch.ops.fbgemm.dense_to_jagged(padded, [offsets], total)[0]


def _segment_ids(lengths: torch.Tensor, total: int) -> torch.Tensor:
    """Row → the sample it belongs to, for `total` rows of `lengths`."""
    samples = torch.arange(lengths.numel(), device=lengths.device)
    return torch.repeat_interleave(samples, lengths, output_size=total)


def _rank_in_segment(lengths: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """Row → its position inside its own sample's sequence."""
    starts = offsets_of(lengths)[:-1]
    return torch.arange(segment.numel(), device=segment.device) - starts[segment]


def concat_positions(left_lengths: torch.Tensor, right_lengths: torch.Tensor,
                     total_left: int, total_right: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each left and each right row lands when every sample's right sequence is
    appended to its left one."""
    out_starts = offsets_of(left_lengths + right_lengths)[:-1]
    seg_l = _segment_ids(left_lengths, total_left)
    seg_r = _segment_ids(right_lengths, total_right)
    pos_l = out_starts[seg_l] + _rank_in_segment(left_lengths, seg_l)
    pos_r = out_starts[seg_r] + left_lengths[seg_r] + _rank_in_segment(right_lengths, seg_r)
    return pos_l, pos_r


def concat(left: torch.Tensor, left_lengths: torch.Tensor,
           right: torch.Tensor, right_lengths: torch.Tensor) -> torch.Tensor:
    """Per sample, `left_b` followed by `right_b`; lengths `left_lengths + right_lengths`.

    Values are [L, ...] (any trailing shape, 1-D allowed)."""
    pos_l, pos_r = concat_positions(left_lengths, right_lengths, left.shape[0], right.shape[0])
    positions = torch.cat([pos_l, pos_r])
    source_of = torch.empty_like(positions)  # the inverse permutation: output row → input row
    source_of[positions] = torch.arange(positions.numel(), device=positions.device)
    return torch.cat([left, right]).index_select(0, source_of)


def split(values: torch.Tensor, left_lengths: torch.Tensor, right_lengths: torch.Tensor,
          total_right: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of `concat`: each sample's first `left_lengths[b]` rows, then its
    `right_lengths[b]` others (`total_right` = their sum, known to the caller)."""
    pos_l, pos_r = concat_positions(left_lengths, right_lengths,
                                    values.shape[0] - total_right, total_right)
    return values.index_select(0, pos_l), values.index_select(0, pos_r)
