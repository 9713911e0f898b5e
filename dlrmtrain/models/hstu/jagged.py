"""Jagged sequences: a batch's rows stored back to back, `values[offsets[b]:offsets[b+1]]`
being sample b's sequence.

Plain torch index arithmetic (any dtype, CPU and GPU, autograd), fbgemm-free: fbgemm's CPU
`jagged_to_padded_dense` has no float64 kernel, which the exactness tests use, and the
attention kernels built on this module run on machines with torch alone.
Concatenating and splitting two jagged batches per sample is an index permutation,
so no [B, N, D] buffer is made for it.
"""

from __future__ import annotations

import torch


def offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    """[B] lengths → [B + 1] offsets, starting at 0, in the lengths' dtype (the integers of
    fbgemm's `asynchronous_complete_cumsum`; no host sync)."""
    return torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0, dtype=lengths.dtype)])


def _padded_index(offsets: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Jagged row → (sample, position in the sample)."""
    lengths = offsets[1:] - offsets[:-1]
    sample = _segment_ids(lengths, total)
    return sample, torch.arange(total, device=offsets.device) - offsets[:-1][sample]


def to_padded(values: torch.Tensor, offsets: torch.Tensor, max_len: int,
              padding_value: float = 0.0) -> torch.Tensor:
    """[L, ...] jagged → [B, max_len, ...], `padding_value` past each sample's length
    (the reference's fbgemm `jagged_to_padded_dense`; rows past max_len must not exist)."""
    sample, position = _padded_index(offsets, values.shape[0])
    padded = values.new_full((offsets.shape[0] - 1, max_len, *values.shape[1:]), padding_value)
    return padded.index_put((sample, position), values)


def to_jagged(padded: torch.Tensor, offsets: torch.Tensor, total: int) -> torch.Tensor:
    """[B, N, ...] padded → [total, ...]: each sample's first length rows, back to back
    (`total` = offsets[-1], passed in so that no host sync is needed)."""
    return padded[_padded_index(offsets, total)]


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
