"""The dedup kernels against plain-Python references (single process)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dlrmtrain.comm.dedup import kernels
from dlrmtrain.comm.dedup.kernels import (
    block_unique,
    expand_rows,
    segment_sum_rows,
)


def one_hot_blocks_unique(values, offsets, lengths, starts, sizes, nums):
    """Many one-hot blocks in one `blocks_unique` call, block by block."""
    return kernels.blocks_unique(values, offsets, lengths, starts, sizes, 1, nums).split()


def _kjt_parts(bags: list[list[int]]):
    lengths = torch.tensor([len(b) for b in bags], dtype=torch.int64)
    offsets = torch.cumsum(lengths, 0) - lengths
    values = torch.tensor([i for b in bags for i in b], dtype=torch.int64)
    return values, offsets, lengths


def _check(bags: list[list[int]], width: int, num_embeddings: int = 50) -> None:
    values, offsets, lengths = _kjt_parts(bags)
    r = block_unique(values, offsets, lengths, width, num_embeddings)
    distinct = sorted({tuple(b) for b in bags})  # Python tuple order = lexicographic, prefix first
    assert not bool(r.bad_ids)
    assert bool(r.overflow) == (max((len(b) for b in bags), default=0) > width)
    if not bool(r.overflow):  # keys are exact only when no bag outgrew the width
        n = int(r.count)
        assert n == len(distinct)
        assert [distinct[i] for i in r.inverse.tolist()] == [tuple(b) for b in bags]
        for u in range(n):  # first occurrence of each unique bag
            assert r.first[u].item() == [tuple(b) for b in bags].index(distinct[u])


@pytest.mark.parametrize("seed", range(5))
def test_random_jagged_bags_match_python_sets(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    bags = [torch.randint(0, 4, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist()
            for _ in range(40)]
    for width in (1, 2, 3, 5):
        _check(bags, width)


def test_one_hot_all_equal_all_distinct_and_empty() -> None:
    _check([[7]] * 16, 1)
    _check([[i] for i in range(16)], 1)
    _check([[] for _ in range(16)], 1)
    _check([[3], [], [3], []], 1)
    _check([], 1)


def test_fixed_size_multi_hot_bags() -> None:
    g = torch.Generator().manual_seed(0)
    lookup = torch.randint(0, 50, (6, 5), generator=g)
    bags = [lookup[i].tolist() for i in torch.randint(0, 6, (30,), generator=g).tolist()]
    _check(bags, 5)


def test_out_of_range_ids_are_flagged() -> None:
    values, offsets, lengths = _kjt_parts([[1], [50], [2]])
    assert bool(block_unique(values, offsets, lengths, 1, 50).bad_ids)
    values, offsets, lengths = _kjt_parts([[1], [-3]])
    assert bool(block_unique(values, offsets, lengths, 1, 50).bad_ids)


def test_expand_and_segment_sum_are_adjoint() -> None:
    rows = torch.randn(4, 3)
    index = torch.tensor([2, 0, 2, 3, 3, 3])
    out = expand_rows(rows, index)
    assert torch.equal(out, rows[index])
    grad = torch.randn(6, 3)
    summed = segment_sum_rows(grad, index, 4)
    torch.testing.assert_close(summed[3], grad[3] + grad[4] + grad[5])
    assert torch.equal(summed[1], torch.zeros(3))


@pytest.mark.parametrize("width", [1, 3, 16, 128])
def test_segment_sum_is_bitwise_index_add(width: int) -> None:
    """The fused path must add each segment's rows in the same order as index_add_."""
    g = torch.Generator().manual_seed(width)
    index = torch.randint(0, 50, (4000,), generator=g) ** 2 // 50  # skewed: long and empty segments
    rows = torch.randn(4000, width, generator=g) * torch.logspace(-6, 6, 4000).unsqueeze(1)
    want = torch.zeros(60, width).index_add_(0, index, rows)
    assert torch.equal(segment_sum_rows(rows, index, 60), want)
    assert torch.equal(segment_sum_rows(rows[:0], index[:0], 5), torch.zeros(5, width))
    half = rows.to(torch.bfloat16)  # 16-bit rows: the float32 sum (same order), rounded once
    assert torch.equal(segment_sum_rows(half, index, 60),
                       torch.zeros(60, width).index_add_(0, index, half.float()).to(torch.bfloat16))


def _bf16_grads(n: int, width: int, segments: int, seed: int):
    """bf16 bag gradients with long runs of duplicate bags (the receiver's backward at a skewed batch)."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(0, segments, (n,), generator=g) ** 2 // segments
    return (torch.randn(n, width, generator=g) * 1e-3).to(torch.bfloat16), index


def test_bf16_sums_accumulate_in_fp32_and_round_once() -> None:
    """A bf16 `index_add_` rounds after every add: with ~100 duplicates per unique bag that is
    far from the float32 sum. segment_sum_rows rounds the float32 sum once (precision.py)."""
    grads, index = _bf16_grads(4000, 16, 40, seed=1)
    exact = torch.zeros(40, 16, dtype=torch.float64).index_add_(0, index, grads.double())
    got = segment_sum_rows(grads, index, 40)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, torch.zeros(40, 16).index_add_(0, index, grads.float()).to(torch.bfloat16))
    # one rounding: within half a bf16 ulp (2**-8 relative: 8 significant bits) of the exact sum, plus float32's reordering
    slack = 2.0 ** -8 * exact.abs() + 2.0 ** -20 * torch.zeros_like(exact).index_add_(
        0, index, grads.double().abs())
    assert bool(((got.double() - exact).abs() <= slack).all())
    # what a bf16 accumulator gives (CUDA's bf16 atomicAdd: a rounding after every add)
    step_rounded = torch.zeros(40, 16, dtype=torch.bfloat16)
    for i, u in enumerate(index.tolist()):
        step_rounded[u] += grads[i]
    assert not bool(((step_rounded.double() - exact).abs() <= slack).all())


class _AccumulatorDtypes(TorchDispatchMode):
    """Records the dtype of every tensor an accumulating op (index_add, scatter_add, embedding_bag) writes."""

    ACCUMULATE = ("index_add", "scatter_add", "embedding_bag", "scatter_reduce")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = next((a for a in self.ACCUMULATE if a in func.overloadpacket.__name__), None)
        if name is not None:
            first = out[0] if isinstance(out, (tuple, list)) else out
            self.seen.append((name, first.dtype))
        return out


def test_bf16_sums_issue_no_16_bit_accumulation() -> None:
    """On CPU torch's bf16 index_add_ happens to sum in float32, on CUDA it rounds after every
    add (atomics): the kernel must never ask for a 16-bit accumulation, on any device."""
    grads, index = _bf16_grads(500, 8, 20, seed=3)
    with _AccumulatorDtypes() as mode:
        segment_sum_rows(grads, index, 20)
    accumulations = [dtype for name, dtype in mode.seen if name in ("index_add", "embedding_bag")]
    assert accumulations and all(dtype == torch.float32 for dtype in accumulations), mode.seen


def test_bf16_dedup_gradient_is_none_path_up_to_one_rounding_per_unique_bag() -> None:
    """`none` on CUDA bf16: the owner's TBE backward gets each bag's bf16 gradient and sums a
    row's bags in float32. dedup: the receiver sums a unique bag's duplicates in float32, rounds
    once to bf16 (what crosses the wire), the owner writes it at the bag's first occurrence and
    the same TBE sums in float32. Same bytes where no bag repeats; else one bf16 rounding."""
    grads, index = _bf16_grads(2000, 8, 30, seed=2)  # one-hot: unique bag u is table row u
    first = torch.full((30,), 2000).scatter_reduce_(0, index, torch.arange(2000), reduce="amin")
    present = first < 2000
    tbe_sum = lambda g, rows: torch.zeros(30, 8).index_add_(0, rows, g.float())  # noqa: E731
    none_grad = tbe_sum(grads, index)
    sums = segment_sum_rows(grads, index, 30)
    owner_grad = torch.zeros(2000, 8, dtype=torch.bfloat16).index_copy_(0, first[present], sums[present])
    dedup_grad = tbe_sum(owner_grad, index)  # zeros at the repeats add nothing
    assert torch.equal(dedup_grad, none_grad.to(torch.bfloat16).float())  # = none's, rounded once
    assert not torch.equal(dedup_grad, none_grad)  # ... which is a rounding none does not make
    singles = torch.arange(2000)  # no duplicates: the same dtype path, bitwise
    assert torch.equal(segment_sum_rows(grads, singles, 2000), grads)


def _assert_block_by_block(batched, kjt_parts, starts, sizes, nums, width: int) -> None:
    """Each block of a batched unique is what block_unique gives that block alone (where exact)."""
    values, offsets, lengths = kjt_parts
    for (s, n, num), got in zip(zip(starts, sizes, nums), batched):
        want = block_unique(values, offsets[s:s + n], lengths[s:s + n], width, num)
        assert bool(got.overflow) == bool(want.overflow) and bool(got.bad_ids) == bool(want.bad_ids)
        if not bool(want.overflow):
            c = int(want.count)
            assert int(got.count) == c
            assert torch.equal(got.inverse, want.inverse)
            assert torch.equal(got.first[:c], want.first[:c])


def test_batched_one_hot_blocks_equal_block_by_block() -> None:
    g = torch.Generator().manual_seed(3)
    bags = [[i] if i < 5 else [] for i in torch.randint(0, 7, (60,), generator=g).tolist()]
    bags[10] = [4, 1]  # one bag too long for width 1: only its block overflows
    values, offsets, lengths = _kjt_parts(bags)
    starts, sizes, nums = [0, 12, 12, 30, 41], [12, 0, 18, 11, 19], [5, 5, 6, 5, 9]
    _assert_block_by_block(one_hot_blocks_unique(values, offsets, lengths, starts, sizes, nums),
                           (values, offsets, lengths), starts, sizes, nums, 1)
    values, offsets, lengths = _kjt_parts([[1], [9], [2]])
    assert [bool(u.bad_ids) for u in one_hot_blocks_unique(values, offsets, lengths, [0, 1], [1, 2], [5, 5])] \
        == [False, True]


def test_equal_contiguous_blocks_match_block_by_block() -> None:
    """The table-wise owner's layout (equal blocks tiling a range) takes the
    broadcast path; it must give what block_unique gives per block, bitwise."""
    g = torch.Generator().manual_seed(5)
    bags = [[i] if i < 9 else [] for i in torch.randint(0, 11, (3 + 4 * 16,), generator=g).tolist()]
    bags[3 + 16 + 2] = [4, 1]   # overflow in block 1 only
    bags[3 + 2 * 16 + 5] = [7]  # 7 >= 6: a bad id in block 2 only
    values, offsets, lengths = _kjt_parts(bags)
    starts, nums = [3, 19, 35, 51], [9, 9, 6, 9]
    assert kernels._equal_contiguous(starts, [16] * 4)
    batched = one_hot_blocks_unique(values, offsets, lengths, starts, [16] * 4, nums)
    for s, num, got in zip(starts, nums, batched):
        want = block_unique(values, offsets[s:s + 16], lengths[s:s + 16], 1, num)
        assert bool(got.overflow) == bool(want.overflow) and bool(got.bad_ids) == bool(want.bad_ids)
        if not bool(want.overflow) and not bool(want.bad_ids):
            c = int(want.count)
            assert int(got.count) == c
            assert torch.equal(got.inverse, want.inverse)
            assert torch.equal(got.first[:c], want.first[:c])
    assert [bool(u.overflow) for u in batched] == [False, True, False, False]
    assert [bool(u.bad_ids) for u in batched] == [False, False, True, False]


def test_int32_lengths_and_offsets_as_the_data_loader_builds_them() -> None:
    bags = [[4], [], [4], [2], [9], [2]]
    values, offsets, lengths = _kjt_parts(bags)
    for use_int32 in (False, True):
        o, l = (offsets.int(), lengths.int()) if use_int32 else (offsets, lengths)
        r = block_unique(values, o, l, 1, 10)
        assert int(r.count) == 4 and r.inverse.tolist() == [2, 0, 2, 1, 3, 1]
        (b,) = one_hot_blocks_unique(values, o, l, [0], [6], [10])
        assert torch.equal(b.inverse, r.inverse)


@pytest.mark.parametrize("width", [2, 3, 5, 8, 100])
def test_multi_hot_blocks_keyed_together_equal_block_by_block(width: int) -> None:
    """Equal-width multi-hot blocks share log2(width) + 1 sorts (DCNv2's widths: 2 .. 100) and give
    block_unique's results per block, bitwise: DCNv2-like fixed bags and ragged ones with repeats."""
    g = torch.Generator().manual_seed(width)
    pool = [torch.randint(0, 6, (int(n),), generator=g).tolist()
            for n in torch.randint(0, width + 1, (12,), generator=g)]
    pool += [[3] * width, [3] * (width - 1), [3] * (width - 1) + [0]]  # a prefix and near-equal bags
    bags = [pool[i] for i in torch.randint(0, len(pool), (90,), generator=g).tolist()]
    bags[40] = [1] * (width + 1)  # too long for the key width: only its block overflows
    values, offsets, lengths = _kjt_parts(bags)
    starts, sizes, nums = [0, 12, 12, 30, 41, 70], [12, 0, 18, 11, 29, 20], [6, 6, 7, 6, 9, 6]
    batched = kernels.blocks_unique(values, offsets, lengths, starts, sizes, width, nums)
    assert batched.counts.shape == (6,)
    _assert_block_by_block(batched.split(), (values, offsets, lengths), starts, sizes, nums, width)
    assert batched.overflow.tolist() == [False, False, False, True, False, False]
    values, offsets, lengths = _kjt_parts([[1, 2], [9], [2, 2]])
    assert kernels.blocks_unique(values, offsets, lengths, [0, 1], [1, 2], 2, [5, 5]).bad_ids.tolist() \
        == [False, True]


def test_multi_hot_sorts_do_not_grow_with_blocks_or_columns() -> None:
    """One sort per halving of the key width plus one, for 2 blocks or 16 (one per sample rank)."""
    for nblocks in (2, 16):
        values, offsets, lengths = _kjt_parts([[i % 5, i % 3, 1] for i in range(16 * nblocks)])
        with torch.profiler.profile() as prof:
            kernels.blocks_unique(values, offsets, lengths, [16 * j for j in range(nblocks)], [16] * nblocks,
                                  100, [5] * nblocks)
        sorts = sum(1 for e in prof.events() if e.name == "aten::sort")
        assert sorts == 7 + 1, sorts  # ceil(log2 100) pairings, then the (block, code) sort
