"""Position and time-bucket encodings (the reference's `HSTUPositionalEncoder` with
its PyTorch kernel `pytorch_add_timestamp_positional_embeddings`, sqrt buckets).

    x · sqrt(D) + position_table[pos] + time_table[bucket]

pos: contextual tokens 0..C-1; the first candidate C, and history rows count up from
it going back in time (the most recent event C + 1, ...; the same positions in every
sample whatever its length), capped at the table's last row; every candidate gets C.
bucket: floor(sqrt((query_time - t) / 60 s)), capped at the table's last row (the
reference's Triton kernel, the one its yambda gin runs; its PyTorch kernel caps at the
table's width − 1 instead, i.e. the transducer dim − 1: 511 at dim 512, a bug);
query_time is the sample's last row (its candidate's timestamp). The gap is an int64
difference computed in fp32 from there on, as both of the reference's kernels do: a
float64 sqrt gives another bucket for some gaps (the first on the 5 s grid at
63,160,550 s: 1025, not fp32's 1026). torch's CPU fp32 sqrt is not correctly rounded
everywhere (an AMD AVX2 CPU gives 1025.99988 for that gap's 1052675.875): there it too
buckets 1025, as the reference's PyTorch kernel does on that CPU.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dlrmtrain.models.hstu import jagged

TIME_BUCKET_SECONDS = 60.0
"""Time differences are bucketed as sqrt(seconds / this)."""


def position_ids(lengths: torch.Tensor, num_targets: torch.Tensor, max_len: int,
                 num_contextual: int, num_positions: int) -> torch.Tensor:
    """[B, N] index into the position table (the reference's `_get_col_indices`)."""
    batch = lengths.shape[0]
    cols = torch.arange(max_len, device=lengths.device).expand(batch, max_len)
    last_history = (lengths - num_targets).view(-1, 1)
    ids = last_history - torch.minimum(cols, last_history) + num_contextual
    ids = ids.clamp(max=num_positions - 1)
    if num_contextual > 0:
        ids = torch.cat([torch.arange(num_contextual, device=lengths.device).expand(batch, -1),
                         ids[:, num_contextual:]], dim=1)
    return ids


def time_bucket_ids(timestamps: torch.Tensor, lengths: torch.Tensor, num_buckets: int
                    ) -> torch.Tensor:
    """[B, N] padded timestamps → [B, N] bucket ids in [0, num_buckets]."""
    query_time = torch.gather(timestamps, 1, (lengths - 1).clamp(min=0).unsqueeze(1))
    delta = (query_time - timestamps).to(torch.float32).clamp(min=1e-6) / TIME_BUCKET_SECONDS
    return torch.sqrt(delta).clamp(min=0).to(torch.int32).clamp(max=num_buckets).to(torch.int64)


class PositionalEncoder(nn.Module):
    def __init__(self, num_positions: int, num_time_buckets: int, dim: int,
                 num_contextual: int) -> None:
        super().__init__()
        self.num_contextual = num_contextual
        self.scale = dim ** 0.5
        bound_pos, bound_time = math.sqrt(1.0 / num_positions), math.sqrt(1.0 / num_time_buckets)
        self.position_table = nn.Parameter(
            torch.empty(num_positions, dim).uniform_(-bound_pos, bound_pos))
        self.time_table = nn.Parameter(
            torch.empty(num_time_buckets + 1, dim).uniform_(-bound_time, bound_time))

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                num_targets: torch.Tensor, timestamps: torch.Tensor, max_len: int) -> torch.Tensor:
        """x [L, D], timestamps [L] (int64 seconds), jagged by `offsets` → [L, D]."""
        pos = position_ids(lengths, num_targets, max_len, self.num_contextual,
                           self.position_table.shape[0])
        padded_ts = jagged.to_padded(timestamps.unsqueeze(-1), offsets, max_len).squeeze(-1)
        buckets = time_bucket_ids(padded_ts, lengths, self.time_table.shape[0] - 1)
        added = self.position_table[pos] + self.time_table[buckets]          # [B, N, D]
        padded = jagged.to_padded(x * self.scale, offsets, max_len)
        return jagged.to_jagged(padded + added.to(x.dtype), offsets, x.shape[0])


def positional_params(num_positions: int, num_time_buckets: int, dim: int) -> int:
    return (num_positions + num_time_buckets + 1) * dim
