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
import torch.nn.functional as F
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm import streams
from dlrmtrain.comm.dedup.kernels import Segments, host_to_device
from dlrmtrain.comm.dedup.plan import DedupPlan, DedupStep
from dlrmtrain.comm.layout import SequenceLayout


class SequencePlanner:
    """Plans the distinct-row all-to-all that replaces TorchRec's sequence output dist.

    Both ends' keys go through ONE sort: the owner's keys are group·radix + id
    (groups 0..G-1: destination rank, table), the sample rank's are offset by
    G groups (G..2G-1: owner rank, table), so the owner's values sort first and
    each end's order is the key order above. A value's key is computed from
    per-bag constants, `(id // block)·coef + id + base`: row-wise sample bags
    take the owner rank from the id (TorchRec's bucketization) and keep the
    global id, which orders one owner's block as its local ids do; every other
    bag has block = radix, so the quotient of a valid id is 0. The whole plan is
    about thirty whole-tensor ops whatever the world size or table count: on a
    CPU step of DLRMv4's mini config it was op launches, not arithmetic, that
    cost the time.
    """

    fallback_warning = "sequence dedup never falls back"

    def __init__(self, layout: SequenceLayout, rank: int) -> None:
        self.layout = layout
        self.rank = rank
        self.world_size = layout.world_size
        self.num_tables = len(layout.tables)
        self.radix = layout.radix
        self._bag_keys: dict[tuple, torch.Tensor] = {}  # batch layout -> per-bag key constants
        self._bounds: dict[torch.device, torch.Tensor] = {}

    def plan(self, step: DedupStep) -> DedupPlan:
        lay, T, device = self.layout, self.num_tables, step.device
        groups = self.world_size * T
        owner, sample = step.owner_kjt, step.sample_kjt
        n_owner, n_sample = owner.values().numel(), sample.values().numel()  # host integers: tensor sizes
        ids = torch.cat([owner.values(), sample.values()]).to(torch.int64)
        bags = self._key_constants(step, owner, sample)
        block, coef, base, rows = torch.repeat_interleave(
            bags, torch.cat([owner.lengths(), sample.lengths()]), dim=1, output_size=ids.numel())
        key = torch.div(ids, block, rounding_mode="floor") * coef + ids + base
        bad = ((ids < 0) | (ids >= rows)).any()
        sorted_key, perm = torch.sort(key, stable=True)  # stable: a key's first value comes first
        is_new = F.pad(sorted_key[1:] != sorted_key[:-1], (1, 0), value=True)
        uniques_upto = torch.cumsum(is_new, 0)  # uniques among sorted values [0, i]
        # where each group starts in the sorted keys, and the uniques before it
        starts = torch.searchsorted(sorted_key, self._group_bounds(device))
        before = F.pad(uniques_upto, (1, 0))[starts]
        host = torch.cat([bad.view(1).long(), starts, before]).tolist()  # the one host sync
        if host[0]:
            raise ValueError(f"sequence dedup (tables {lay.tables}, features {lay.features}): ids outside "
                             f"their table reached the codec")
        bounds, seen = host[1:2 * groups + 2], host[2 * groups + 2:]
        stock = [bounds[g + 1] - bounds[g] for g in range(2 * groups)]  # values per group
        counts = [seen[g + 1] - seen[g] for g in range(2 * groups)]     # distinct values per group
        send_units, total_units = seen[groups], seen[2 * groups]
        firsts = torch.nonzero_static(is_new, size=total_units).view(-1)  # sorted place of each unique
        recv_order = perm[n_owner:] - n_owner  # the sample rank's values in key order
        recv_index = torch.empty_like(recv_order).scatter_(0, recv_order, uniques_upto[n_owner:] - (send_units + 1))
        D = lay.dim
        send_counts, recv_counts = counts[:groups], counts[groups:]
        plan = DedupPlan(
            unit=D,
            send_index=perm[firsts[:send_units]],  # the owner's first occurrences, in key order: the message
            recv_index=recv_index,                  # key order = receive-buffer order (rank-major)
            send_splits=[D * sum(send_counts[r * T:(r + 1) * T]) for r in range(self.world_size)],
            recv_splits=[D * sum(recv_counts[r * T:(r + 1) * T]) for r in range(self.world_size)],
            out_shape=(n_sample, D),
            recv_segments=Segments(recv_order, firsts[send_units:] - n_owner))
        self._account(step, send_counts, recv_counts, stock[:groups], stock[groups:])
        return plan

    def _key_constants(self, step: DedupStep, owner: KeyedJaggedTensor, sample: KeyedJaggedTensor) -> torch.Tensor:
        """(block, coef, base, rows) per bag of the owner's KJT, then of the sample rank's: the key
        constants of its ids and the bound they must lie below. Made once per batch layout; its
        non-blocking copy has finished before any other stream reads it, since the plan that makes
        it reads its counts back to the host."""
        cache_key = (tuple(step.sizes), owner.lengths().numel(), sample.lengths().numel(), step.device)
        bags = self._bag_keys.get(cache_key)
        if bags is None:
            if len(self._bag_keys) >= 8:  # a few layouts in a run (train, eval, a last partial batch)
                self._bag_keys.clear()
            bags = self._bag_keys[cache_key] = host_to_device(self._bag_key_lists(step), step.device).view(4, -1)
        return _used_here(bags)

    def _bag_key_lists(self, step: DedupStep) -> list[int]:
        lay, T, radix = self.layout, self.num_tables, self.radix
        groups = self.world_size * T
        dest = [r for r, size in enumerate(step.sizes) for _ in range(size)]  # sample rank of each global bag
        block, coef, base, rows = [], [], [], []
        for t, n in zip(lay.owner_tables, lay.owner_rows):  # owner: key (destination rank, table, id)
            block += [radix] * len(dest)
            coef += [0] * len(dest)
            base += [(d * T + t) * radix for d in dest]
            rows += [n] * len(dest)
        for f, (t, n) in enumerate(zip(lay.sample_tables, lay.sample_rows)):  # sample: (owner rank, table, id)
            if lay.sample_owner is not None:  # table-wise: one owner per table
                b, c, o = radix, 0, (groups + lay.sample_owner[f] * T + t) * radix
            else:  # row-wise: owner id // block (TorchRec's bucketization), then the id
                b, c, o = lay.sample_block[f], T * radix, (groups + t) * radix
            block += [b] * step.batch
            coef += [c] * step.batch
            base += [o] * step.batch
            rows += [n] * step.batch
        return block + coef + base + rows

    def _group_bounds(self, device: torch.device) -> torch.Tensor:
        """The first key of each group, both ends' (2G groups), and the end of the last."""
        bounds = self._bounds.get(device)
        if bounds is None:
            n = 2 * self.world_size * self.num_tables + 1
            bounds = self._bounds[device] = host_to_device([g * self.radix for g in range(n)], device)
        return _used_here(bounds)

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
        step.stats.ids_looked_up += sum(send_stock)  # every position the owner got, looked up
        step.stats.rows_looked_up += sum(send_stock)
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


def _used_here(constant: torch.Tensor) -> torch.Tensor:
    """A cached constant read on the current stream (under the pipeline, the data-dist one): once
    dropped from the cache, its memory must wait for this stream (`comm.streams`)."""
    streams.record_tensor(constant, streams.current_stream(constant.device))
    return constant
