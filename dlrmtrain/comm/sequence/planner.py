"""dedup for sequence embeddings: the `DedupPlanner` of an unpooled (EmbeddingCollection) all-to-all.

TorchRec's `SequenceEmbeddingsAllToAll` sends one row per id position: the
owner's lookup output (rows in its KJT's value order: feature, sample rank,
sample, position) goes to the sample ranks, which receive them in their own
KJT's value order (row-wise: after TorchRec's unbucketize permutation). Here,
per (destination rank, table) only the distinct ids' rows cross:

- owner: key each value by (destination rank, table, id as it received it),
  sort, and send the row of each key's first occurrence, in key order;
- sample rank: key each of its own values by (owner rank, table, id within the
  owner's rows) — table-wise the table's rank and the id; row-wise
  id // block and id mod block, what TorchRec's bucketization sends — and
  sort the same way: a value's unique index is its row in the receive buffer.

Both ends hold the same ids in every (rank pair, table) block, so they agree on
the distinct rows and their order without sending an index or a size.
Forward output rows are copies of the rows `none` would deliver: bitwise
equal. Backward (dedup/transport.py): the sample rank segment-sums the
gradient per distinct row, the owner writes each sum at its first occurrence
(zeros elsewhere); the fused embedding backward sums per id anyway, so the
update equals `none`'s up to float summation order. One host sync per step
(all counts and the bad-id flags in one `.tolist()`).
"""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.dedup.kernels import host_to_device, sorted_unique_one_hot
from dlrmtrain.comm.dedup.plan import DedupPlan, DedupStep
from dlrmtrain.comm.sequence.layout import SequenceLayout


def _value_features(kjt: KeyedJaggedTensor, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per value of `kjt`: (feature index, sample index within the stride). No host sync."""
    lengths = kjt.lengths()
    n = kjt.values().numel()  # a host integer: the values tensor's size
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths,
                                  output_size=n)
    return torch.div(bag, stride, rounding_mode="floor"), bag % stride


class SequencePlanner:
    """Plans the distinct-row all-to-all that replaces TorchRec's sequence output dist."""

    fallback_warning = "sequence dedup never falls back"

    def __init__(self, layout: SequenceLayout, rank: int) -> None:
        self.layout = layout
        self.rank = rank
        self.world_size = layout.world_size
        self.num_tables = len(layout.tables)
        self.radix = layout.radix

    def plan(self, step: DedupStep) -> DedupPlan:
        lay, W, T, radix, device = self.layout, self.world_size, self.num_tables, self.radix, step.device
        groups = W * T
        owner, sample = step.owner_kjt, step.sample_kjt
        # owner: values of every sample rank; key (destination rank, table, id as received)
        o_ids = owner.values().to(torch.int64)
        o_feature, o_sample = _value_features(owner, step.global_batch)
        o_dest = torch.bucketize(o_sample, host_to_device(step.sizes, device).cumsum(0), right=True)
        o_group = o_dest * T + host_to_device(lay.owner_tables, device)[o_feature]
        o_bad = (o_ids < 0) | (o_ids >= host_to_device(lay.owner_rows, device)[o_feature])
        _, o_first, o_counts = sorted_unique_one_hot(o_group, o_ids, ~o_bad, groups, radix)
        o_stock = torch.zeros(groups, dtype=torch.int64, device=device).scatter_add_(
            0, o_group, torch.ones_like(o_group))
        # sample rank: own values; key (owner rank, table, id within the owner's rows)
        s_ids = sample.values().to(torch.int64)
        s_feature, _ = _value_features(sample, step.batch)
        if lay.sample_owner is not None:  # table-wise: one owner per table
            s_owner, s_local = host_to_device(lay.sample_owner, device)[s_feature], s_ids
        else:  # row-wise: TorchRec's bucketization
            block = host_to_device(lay.sample_block, device)[s_feature]
            s_owner = torch.div(s_ids, block, rounding_mode="floor")
            s_local = s_ids - s_owner * block
        s_bad = (s_ids < 0) | (s_ids >= host_to_device(lay.sample_rows, device)[s_feature])
        s_group = torch.where(s_bad, 0, s_owner * T + host_to_device(lay.sample_tables, device)[s_feature])
        s_uid, _, s_counts = sorted_unique_one_hot(s_group, s_local, ~s_bad, groups, radix)
        s_stock = torch.zeros(groups, dtype=torch.int64, device=device).scatter_add_(
            0, s_group, torch.ones_like(s_group))
        flags = torch.stack([o_bad.any(), s_bad.any()]).long()
        host = torch.cat([flags, o_counts, s_counts, o_stock, s_stock]).tolist()  # the one host sync
        if host[0] or host[1]:
            raise ValueError(f"sequence dedup (tables {lay.tables}, features {lay.features}): ids outside "
                             f"their table reached the codec")
        send_counts, recv_counts = host[2:2 + groups], host[2 + groups:2 + 2 * groups]
        send_stock, recv_stock = host[2 + 2 * groups:2 + 3 * groups], host[2 + 3 * groups:]
        D = lay.dim
        plan = DedupPlan(
            unit=D,
            send_index=o_first[:sum(send_counts)],  # first occurrences in key order: the message
            recv_index=s_uid,                        # key order = receive-buffer order (rank-major)
            send_splits=[D * sum(send_counts[r * T:(r + 1) * T]) for r in range(W)],
            recv_splits=[D * sum(recv_counts[r * T:(r + 1) * T]) for r in range(W)],
            out_shape=(s_ids.numel(), D))
        self._account(step, send_counts, recv_counts, send_stock, recv_stock)
        return plan

    def _account(self, step: DedupStep, send_counts: list[int], recv_counts: list[int],
                 send_stock: list[int], recv_stock: list[int]) -> None:
        """This step's bytes per table: rows per (rank, table) block, host integers only.

        "bags" of a sequence table are its id positions (one embedding row each).
        The id all-to-all is counted as values plus lengths: table-wise each
        feature's lengths go to its one owner, row-wise to every rank.
        """
        lay, W, T, D = self.layout, self.world_size, self.num_tables, self.layout.dim
        owner, sample = step.owner_kjt, step.sample_kjt
        value_bytes, length_bytes = sample.values().element_size(), sample.lengths().element_size()
        length_copies = 1 if lay.sample_owner is not None else W
        for t, name in enumerate(lay.tables):
            stats = step.stats.table(name)
            for r in range(W):
                g = r * T + t
                stats.add_rows(D, step.wire_bytes, step.elem_bytes, sent=send_counts[g], received=recv_counts[g],
                               stock_sent=send_stock[g], stock_received=recv_stock[g], bags=recv_stock[g])
            sample_features = sum(1 for x in lay.sample_tables if x == t)
            owner_features = sum(1 for x in lay.owner_tables if x == t)
            stats.id_sent_bytes += (sum(recv_stock[r * T + t] for r in range(W)) * value_bytes
                                    + length_copies * step.batch * sample_features * length_bytes)
            stats.id_recv_bytes += (sum(send_stock[r * T + t] for r in range(W)) * owner.values().element_size()
                                    + step.global_batch * owner_features * owner.lengths().element_size())
