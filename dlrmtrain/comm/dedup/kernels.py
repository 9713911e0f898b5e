"""Every pure-torch kernel of the dedup codec: bag keys, unique, gather, expand, segment-sum, scatter.

Training calls exactly these functions (transport.py, table_wise.py,
row_wise.py, buffers.py), and scripts/bench_codec_kernels.py times them; this
module imports torch only, so the benchmark runs without TorchRec or fbgemm.

Everything here has fixed output sizes (upper bound: the block's bag count) so
that no kernel needs the number of unique bags on the host; the caller reads
all blocks' counts in ONE host sync per output dist per step. The same code
runs on the sending and the receiving rank over the same ids, so both derive
the same unique order bitwise — that agreement is what makes the codec
lossless without sending an inverse index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def host_to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor of `values` on `device` without a host sync.

    `torch.tensor(values, device=cuda)` is a blocking copy that waits for the
    stream; staging in pinned memory and copying with non_blocking=True does not.
    """
    t = torch.tensor(values, dtype=torch.int64)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


@dataclass
class BlockUnique:
    """Unique bags of one (feature, sample-rank) block of B bags.

    `inverse[b]` is the index of bag b's unique bag (lexicographic order of the
    bag's id sequence); `first[u]` the first bag holding unique u (valid for
    u < count); `count` the number of unique bags as a 0-d device tensor.
    `overflow` says a bag was longer than the key width (keys not exact);
    `bad_ids` says an id lay outside [0, num_embeddings).
    """

    inverse: torch.Tensor
    first: torch.Tensor
    count: torch.Tensor
    overflow: torch.Tensor
    bad_ids: torch.Tensor


def bag_keys(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
             width: int, num_embeddings: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bags as rows of a [B, width] id matrix padded with -1; overflow and bad-id flags.

    -1 padding sorts below every valid id, so rows of different lengths sort
    like their id sequences (a prefix first) and an empty bag is all -1.
    """
    pos = torch.arange(width, device=values.device)
    valid = pos.unsqueeze(0) < lengths.unsqueeze(1)
    if values.numel() == 0:
        keys = torch.full((lengths.numel(), width), -1, dtype=torch.int64, device=values.device)
    else:
        idx = (offsets.unsqueeze(1) + pos.unsqueeze(0)).clamp_(max=values.numel() - 1)
        keys = torch.where(valid, values[idx].to(torch.int64), -1)
    overflow = (lengths > width).any()
    bad_ids = (valid & ((keys < 0) | (keys >= num_embeddings))).any()
    return keys, overflow, bad_ids


def _dense_rank(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense rank of each element (0 = smallest), plus the stable sort it used."""
    sorted_key, perm = torch.sort(key, stable=True)
    is_new = torch.ones_like(sorted_key, dtype=torch.bool)
    is_new[1:] = sorted_key[1:] != sorted_key[:-1]
    group = torch.cumsum(is_new, 0) - 1
    rank = torch.empty_like(group)
    rank[perm] = group
    return rank, perm, group, is_new


def unique_bags(keys: torch.Tensor, num_embeddings: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unique rows of `keys` in lexicographic order: (inverse, first, count).

    Rows are ranked column by column: (rank of the prefix, next id) is packed
    into one int64 that preserves lexicographic order, then re-ranked — a
    radix-style lexsort with one sort per column (one-hot bags: one sort).
    """
    n, width = keys.shape
    if n == 0:
        empty = keys.new_zeros(0)
        return empty, empty, keys.new_zeros(())
    radix = num_embeddings + 1  # ids + 1 lie in [0, num_embeddings]
    rank, perm, group, is_new = _dense_rank(keys[:, 0])
    for col in range(1, width):
        rank, perm, group, is_new = _dense_rank(rank * radix + (keys[:, col] + 1))
    # the stable sort keeps equal bags in bag order, so the minimum bag index
    # per group is the first occurrence
    first = torch.full((n,), n, dtype=torch.int64, device=keys.device)
    first.scatter_reduce_(0, group, perm, reduce="amin", include_self=True)
    count = group[-1] + 1
    return rank, first, count


def block_unique(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                 width: int, num_embeddings: int) -> BlockUnique:
    """Key, check and deduplicate one block of bags (see `BlockUnique`)."""
    keys, overflow, bad_ids = bag_keys(values, offsets, lengths, width, num_embeddings)
    inverse, first, count = unique_bags(keys, num_embeddings)
    return BlockUnique(inverse, first, count, overflow, bad_ids)


def gather_rows(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows[index] — the owner's forward encode (the unique rows it sends)."""
    return torch.index_select(rows, 0, index)


def expand_rows(unique_rows: torch.Tensor, index: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """out[i] = unique_rows[index[i]] — the receiver's forward decode."""
    return torch.index_select(unique_rows, 0, index, out=out) if out is not None \
        else torch.index_select(unique_rows, 0, index)


@dataclass
class Segments:
    """Which rows each segment sums, in the order it adds them: `order` lists row indices
    segment by segment (ascending within a segment), segment u's starting at `offsets[u]`.

    A planner that sorted the rows by segment anyway (sequence dedup) keeps this
    from its sort, so the backward's sum needs no sort of its own.
    """

    order: torch.Tensor
    offsets: torch.Tensor


def _segments_of(index: torch.Tensor, num_segments: int) -> Segments:
    """The `Segments` of `index` (row i in segment index[i]): a stable sort and a count, no host sync."""
    order = torch.sort(index, stable=True).indices
    # counted by scatter, not bincount: bincount reads the max back to the host (a CUDA sync)
    sizes = torch.zeros(num_segments, dtype=torch.int64, device=index.device).scatter_add_(
        0, index.long(), torch.ones_like(index, dtype=torch.int64))
    return Segments(order, torch.cumsum(sizes, 0) - sizes)


def segment_sum_rows(rows: torch.Tensor, index: torch.Tensor, num_segments: int,
                     segments: Segments | None = None) -> torch.Tensor:
    """out[u] = sum of rows[i] with index[i] == u — the receiver's backward encode.

    Sums accumulate in float32 whatever the rows' dtype and are cast to it once
    at the end: a bf16 (or fp16) gradient is rounded once per unique bag, not
    after every add as a 16-bit `index_add_` would (and without its CUDA
    atomics, whose order varies run to run). dlrmtrain/precision.py's table
    says where that one rounding sits against `none`'s bf16 path.

    float32 rows go through embedding_bag's fused gather-and-sum over the rows
    stably sorted by segment: each segment still adds its rows in ascending i
    from zero, so the result is bitwise `index_add_`'s, at a third of the time
    on CPU (index_add_ costs ~100 ns per row there) and without CUDA atomics.
    `segments` (what a planner kept from its own sort, e.g. sequence dedup; else
    `_segments_of` sorts here) saves that sort.
    """
    if rows.dtype in (torch.float16, torch.bfloat16):
        return segment_sum_rows(rows.float(), index, num_segments, segments).to(rows.dtype)
    if rows.dtype != torch.float32 or rows.numel() == 0:
        out = rows.new_zeros((num_segments, rows.shape[1]))
        out.index_add_(0, index, rows)
        return out
    if segments is None:
        segments = _segments_of(index, num_segments)
    return torch.nn.functional.embedding_bag(segments.order, rows, segments.offsets, mode="sum")


def scatter_rows(out: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """out[index[u]] = rows[u] (zeros elsewhere when `out` is zeroed) — the owner's backward decode."""
    return out.index_copy_(0, index, rows)


@dataclass
class BlocksUnique:
    """Unique bags of many blocks, computed together: one tensor per quantity, not per block.

    Block j holds bags [bag_offsets[j], bag_offsets[j] + sizes[j]) of `inverse`
    (each bag's unique index within its block); `first[j, u]` is the first bag
    (within block j) of unique u, valid for u < counts[j]; `counts`,
    `overflow` and `bad_ids` hold one entry per block (see `BlockUnique`).
    """

    inverse: torch.Tensor
    first: torch.Tensor
    counts: torch.Tensor
    overflow: torch.Tensor
    bad_ids: torch.Tensor
    sizes: list[int]

    @property
    def bag_offsets(self) -> list[int]:
        out = [0]
        for n in self.sizes[:-1]:
            out.append(out[-1] + n)
        return out

    def split(self) -> list[BlockUnique]:
        """One `BlockUnique` per block, as views (for callers that take blocks one by one)."""
        counts, overflow, bad = self.counts.unbind(), self.overflow.unbind(), self.bad_ids.unbind()
        return [BlockUnique(self.inverse[o:o + n], self.first[j, :n], counts[j], overflow[j], bad[j])
                for j, (o, n) in enumerate(zip(self.bag_offsets, self.sizes))]


def blocks_unique(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, starts: list[int],
                  sizes: list[int], width: int, num_embeddings: list[int]) -> BlocksUnique:
    """`block_unique` at key width `width` for many blocks of one KJT at once, bitwise its results.

    Bags [starts[j], starts[j] + sizes[j]) form block j, of table size
    num_embeddings[j]. The block index is packed above the key, so the sorts
    order every block's bags at once: one sort for one-hot blocks; for wider
    keys, log2(width) + 1 sorts whatever the number of blocks (`_row_codes`).
    """
    device = lengths.device
    nblocks, total = len(sizes), sum(sizes)
    if total == 0:
        zeros = torch.zeros(nblocks, dtype=torch.int64, device=device)
        return BlocksUnique(zeros[:0], zeros.view(nblocks, 1)[:, :0], zeros, zeros.bool(), zeros.bool(), list(sizes))
    if width == 1 and _equal_contiguous(starts, sizes):
        return _equal_contiguous_blocks_unique(values, offsets, lengths, starts[0], nblocks, sizes[0],
                                               num_embeddings)
    # every block's bags and block index in a few whole-batch ops (no per-block tensors)
    block = torch.repeat_interleave(torch.arange(nblocks, device=device),
                                    host_to_device(sizes, device), output_size=total)
    bag_offsets = [0]
    for n in sizes[:-1]:
        bag_offsets.append(bag_offsets[-1] + n)
    shift = host_to_device([s - o for s, o in zip(starts, bag_offsets)], device)
    bags = torch.arange(total, device=device) + shift[block]
    lens = lengths[bags]
    pos = torch.arange(width, device=device)
    valid = pos < lens.unsqueeze(1)
    if values.numel():
        at = (offsets[bags].unsqueeze(1) + pos).clamp_(max=values.numel() - 1)
        ids = torch.where(valid, values[at].to(torch.int64), -1)
    else:
        ids = torch.full((total, width), -1, dtype=torch.int64, device=device)
    limit = host_to_device(num_embeddings, device)[block].unsqueeze(1)
    per_block = lambda flag: torch.zeros(nblocks, dtype=torch.int64, device=device).scatter_add_(  # noqa: E731
        0, block, flag.long()) > 0
    overflow = per_block(lens > width)
    bad = per_block((valid & ((ids < 0) | (ids >= limit))).any(1))
    radix = max(num_embeddings) + 1
    # ids clamped into the key's range (a block with bad ids is reported above; the plan raises)
    codes, bound = (ids[:, 0].clamp(-1, radix - 2) + 1, radix) if width == 1 else _row_codes(ids, radix)
    rank, perm, group, is_new = _dense_rank(block * bound + codes)
    counts = torch.zeros(nblocks, dtype=torch.int64, device=device).scatter_add_(0, block[perm], is_new.long())
    group_offset = torch.cumsum(counts, 0) - counts
    inverse = rank - group_offset[block]
    first_global = torch.full((total,), total, dtype=torch.int64, device=device)
    first_global.scatter_reduce_(0, group, perm, reduce="amin", include_self=True)
    # first[j, u] for every block at once (valid for u < counts[j])
    pick = (group_offset.unsqueeze(1) + torch.arange(max(sizes), device=device)).clamp_(max=total - 1)
    first = first_global[pick] - host_to_device(bag_offsets, device).unsqueeze(1)
    return BlocksUnique(inverse, first, counts, overflow, bad, list(sizes))


def _row_codes(ids: torch.Tensor, radix: int) -> tuple[torch.Tensor, int]:
    """Per row of `ids` ([n, width], -1 padded), an int64 code that orders rows lexicographically.

    Prefix doubling: adjacent columns are paired into one key and the keys of
    all rows and column pairs densely ranked together (one sort), halving the
    width each round. A dense rank keeps the order of what it ranks, so after
    ceil(log2 width) rounds one code per row orders the rows as their id
    sequences (-1, "no id", below every id: a prefix first). Returns the codes
    and an exclusive bound on them.
    """
    cols = ids.clamp(-1, radix - 2) + 1  # in [0, radix)
    bound = radix
    while cols.shape[1] > 1:
        if cols.shape[1] % 2:  # the odd last column pairs with "nothing" (code -1, the same in every row)
            cols = torch.cat([cols, cols.new_full((cols.shape[0], 1), -1)], 1)
        assert bound * (bound + 1) < 2 ** 63, "key range too large to pair columns"
        key = cols[:, 0::2] * (bound + 1) + (cols[:, 1::2] + 1)
        rank = _dense_rank(key.reshape(-1))[0]
        cols, bound = rank.view(key.shape), key.numel()
    return cols[:, 0], bound


def _equal_contiguous(starts: list[int], sizes: list[int]) -> bool:
    """Blocks of one size, each starting where the previous ends: the layout of
    every block of a table-wise owner (tables x sample ranks) without VBE."""
    return sizes[0] > 0 and all(n == sizes[0] for n in sizes) and \
        all(b == a + sizes[0] for a, b in zip(starts, starts[1:]))


def _equal_contiguous_blocks_unique(values: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                                    start: int, nblocks: int, size: int,
                                    num_embeddings: list[int]) -> BlocksUnique:
    """`blocks_unique` for one-hot keys when the blocks tile [start, start + nblocks * size).

    Every per-block quantity is a row of an (nblocks, size) view, so the
    general path's per-bag gathers (block index, limits, group offsets) become
    broadcasts; the sort and its result are the same, bitwise — except in a
    block with ids outside [0, num_embeddings), whose ids are clamped into the
    key range (its `bad_ids` is exact, and the plan raises on it before any
    count or index is used).
    """
    device = lengths.device
    total = nblocks * size
    lens = lengths[start:start + total].view(nblocks, size)
    if values.numel():
        first_value = offsets[start:start + total].clamp(max=values.numel() - 1)
        ids = torch.where(lens > 0, values[first_value].view(nblocks, size).to(torch.int64), -1)
    else:
        ids = torch.full((nblocks, size), -1, dtype=torch.int64, device=device)
    limit = host_to_device(num_embeddings, device).unsqueeze(1)
    overflow = (lens > 1).any(1)
    bad = ((lens > 0) & ((ids < 0) | (ids >= limit))).any(1)
    radix = max(num_embeddings) + 1
    # ids clamped into the key's range so that each block keeps its own slice of
    # the sort even with bad ids (reported above; the plan raises on them)
    block = torch.arange(nblocks, device=device).unsqueeze(1)
    key = block * radix + (ids.clamp(-1, radix - 2) + 1)
    # the block index is the key's high part, so sorted positions
    # [j * size, (j + 1) * size) are block j's bags: per-block work is per row
    sorted_key, perm = torch.sort(key.view(-1), stable=True)
    is_new = torch.ones(total, dtype=torch.bool, device=device)
    is_new[1:] = sorted_key[1:] != sorted_key[:-1]
    local_group = torch.cumsum(is_new.view(nblocks, size), 1) - 1
    counts = local_group[:, -1] + 1
    inverse = torch.empty(total, dtype=torch.int64, device=device)
    inverse[perm] = local_group.view(-1)
    # the stable sort keeps equal ids in bag order: the smallest bag per group is its first
    row_start = block * size
    first = torch.full((nblocks, size), size, dtype=torch.int64, device=device)
    bag_in_block = perm.view(nblocks, size) - row_start
    first.view(-1).scatter_reduce_(0, (row_start + local_group).view(-1), bag_in_block.view(-1),
                                   reduce="amin", include_self=True)
    return BlocksUnique(inverse, first, counts, overflow, bad, [size] * nblocks)


def segment_units(source: torch.Tensor, segments: list[tuple[int, int, int, int]], stride: int) -> torch.Tensor:
    """A message's unit rows from whole-message ops, however many segments it has.

    Segment (at, n, add, d) is n rows r = source[at:at + n]; each row stands for
    units r * stride + add + 0 .. d - 1. Returns every segment's units in order —
    what a loop of per-segment arange / add / cat would give, without one op per
    segment (a rank sends one segment per (destination rank, entry)).
    """
    device = source.device
    rows = sum(n for _, n, _, _ in segments)
    if rows == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    at, n, add, d = host_to_device([x for seg in segments for x in seg], device).view(-1, 4).unbind(1)
    seg = torch.repeat_interleave(torch.arange(len(segments), device=device), n, output_size=rows)
    within = torch.arange(rows, device=device) - (torch.cumsum(n, 0) - n)[seg]
    start = source[at[seg] + within] * stride + add[seg]
    widths = {w for _, c, _, w in segments if c}
    if len(widths) == 1:
        return (start.unsqueeze(1) + torch.arange(widths.pop(), device=device)).reshape(-1)
    per_row = d[seg]
    units = sum(c * w for _, c, _, w in segments)
    row = torch.repeat_interleave(torch.arange(rows, device=device), per_row, output_size=units)
    return start[row] + torch.arange(units, device=device) - (torch.cumsum(per_row, 0) - per_row)[row]


def expand_units(inverse: torch.Tensor, columns: list[tuple[int, int, int]]) -> torch.Tensor:
    """The receiver's expand index, flattened [bags, columns]: column (j, d, base) of bag b reads
    unit base + inverse[j, b] * d of the receive buffer (entry j's unique row of bag b, d units wide)."""
    device = inverse.device
    if not columns or inverse.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    j, d, base = host_to_device([x for c in columns for x in c], device).view(-1, 3).unbind(1)
    return (inverse.index_select(0, j) * d.unsqueeze(1) + base.unsqueeze(1)).t().reshape(-1)


def sorted_unique_one_hot(group: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor,
                          num_groups: int, radix: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unique (group, id) pairs among valid bags, ordered by group then id.

    Returns `uid` (per bag: its unique's index in that order; invalid bags get
    the total count), `first` (per unique: a bag holding it; fixed size, valid
    below the total) and `counts` per group — all fixed-size, no host sync.
    """
    n = ids.numel()
    sentinel = num_groups * radix  # above every valid key: invalid bags sort last
    key = torch.where(valid, group * radix + ids, sentinel)
    sorted_key, perm = torch.sort(key, stable=True)
    valid_sorted = sorted_key < sentinel
    is_new = valid_sorted.clone()
    is_new[1:] &= sorted_key[1:] != sorted_key[:-1]
    rank_sorted = torch.cumsum(is_new, 0) - 1
    total = rank_sorted[-1] + 1 if n else rank_sorted.new_zeros(())
    rank_sorted = torch.where(valid_sorted, rank_sorted, total)
    uid = torch.empty_like(rank_sorted)
    uid[perm] = rank_sorted
    # first occurrence: stable sort keeps equal keys in bag order
    first = torch.full((n + 1,), n, dtype=torch.int64, device=ids.device)
    first.scatter_reduce_(0, torch.where(is_new, rank_sorted, n), perm, reduce="amin", include_self=True)
    counts = torch.zeros(num_groups + 1, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, torch.where(valid_sorted, sorted_key // radix, num_groups), is_new.long())
    return uid, first[:n], counts[:num_groups]
