"""The CPU kernel of `fbgemm::generate_vbe_metadata` that `comm.dedup_at: source` registers
(comm/torchrec/vbe.vbe_metadata): the same outputs as fbgemm 1.8's CPU kernel, which it replaces
because that one indexes tensors bag by bag (~0.5 s a call at 36k bags)."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.comm.dedup import expand
from dlrmtrain.comm.torchrec import pooled_source, vbe


def _args(batch_sizes: list[list[int]], dims: list[int], info_bits: int = 26) -> tuple:
    """The arguments fbgemm's TBE forward passes: per feature t and sample rank r, its bag count."""
    per_feature = [sum(row) for row in batch_sizes]
    B_offsets = torch.tensor([0, *per_feature]).cumsum(0).to(torch.int32)
    by_rank = torch.tensor([[0, *row] for row in batch_sizes]).cumsum(1).to(torch.int32)
    sizes = (torch.tensor(batch_sizes).t() * torch.tensor(dims).view(1, -1)).flatten()
    out_offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
    D_offsets = torch.tensor([0, *dims]).cumsum(0).to(torch.int32)
    max_b = max(max(row) for row in batch_sizes)
    return (B_offsets, by_rank, out_offsets, D_offsets, max(dims), False, max_b, info_bits, sum(per_feature))


def _loop_reference(B_offsets, by_rank, out_offsets, D_offsets, _D, _nobag, _max_b, info_bits, total_B):
    """fbgemm's CPU kernel, bag by bag in plain Python."""
    T, ranks = B_offsets.numel() - 1, by_rank.size(1) - 1
    rows, bt = [0] * total_B, [0] * total_B
    for t in range(T):
        dim = int(D_offsets[t + 1] - D_offsets[t])
        for r in range(ranks):
            for b in range(int(by_rank[t][r + 1] - by_rank[t][r])):
                i = int(B_offsets[t] + by_rank[t][r] + b)
                rows[i] = int(out_offsets[r * T + t]) + b * dim
                bt[i] = (t << info_bits) | int(by_rank[t][r] + b)
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(bt, dtype=torch.int64).to(torch.int32)


CASES = {
    "two_ranks_mixed_dims": ([[3, 2], [0, 4], [5, 0], [1, 1]], [8, 16, 8, 32]),
    "one_rank": ([[4], [2], [7]], [4, 4, 4]),
    "three_ranks_an_empty_feature": ([[2, 0, 1], [0, 0, 0], [1, 3, 2]], [8, 8, 24]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_registered_kernel_returns_what_fbgemms_cpu_kernel_does(name):
    args = _args(*CASES[name])
    fbgemm_own = None if vbe._VBE_KERNELS else torch.ops.fbgemm.generate_vbe_metadata(*args)
    vbe.register_cpu_vbe_metadata()
    rows, b_t_map = torch.ops.fbgemm.generate_vbe_metadata(*args)
    ref_rows, ref_bt = _loop_reference(*args)
    assert rows.dtype == torch.int64 and b_t_map.dtype == torch.int32
    assert torch.equal(rows, ref_rows) and torch.equal(b_t_map, ref_bt)
    if fbgemm_own is not None:  # this process still had fbgemm's kernel: compare with it too
        assert torch.equal(rows, fbgemm_own[0]) and torch.equal(b_t_map, fbgemm_own[1])


def test_preallocated_output_offsets_pass_through_and_registering_twice_is_one_kernel():
    args = _args([[2, 1], [1, 2]], [8, 8])
    given = torch.arange(6, dtype=torch.int64)
    vbe.register_cpu_vbe_metadata()
    vbe.register_cpu_vbe_metadata()
    assert len(vbe._VBE_KERNELS) == 1
    rows, _ = torch.ops.fbgemm.generate_vbe_metadata(*args, given)
    assert rows is given or torch.equal(rows, given)


def test_expand_rows_sums_duplicate_gradients_in_fp32_for_16_bit_rows():
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16, requires_grad=True)
    index = torch.tensor([1, 0, 1, 1])
    out = expand.ExpandRows.apply(rows, index)
    assert torch.equal(out, rows.detach()[index])
    # 256 + 1 + 1 in bf16 pairwise would lose the ones; summed in fp32 it is 258
    out.backward(torch.tensor([[256.0, 0.0], [5.0, 5.0], [1.0, 0.0], [1.0, 0.0]], dtype=torch.bfloat16))
    assert rows.grad.dtype == torch.bfloat16
    assert rows.grad.float().tolist() == [[5.0, 5.0], [258.0, 0.0]]


def _behind_the_old_way(leading: torch.Tensor, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """What the model did before `ExpandRowsBehind`: the expand, then the interaction's concatenation."""
    B, D = leading.shape
    expanded = expand.ExpandRows.apply(rows, index.view(-1)).view(B, -1).reshape(B, -1, D)
    return torch.cat((leading.unsqueeze(1), expanded), dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shards", [1, 2])
def test_expand_rows_behind_is_the_expand_then_the_concatenation_bitwise_both_ways(dtype, shards):
    """One gather of the leading row and the rows (dedup at the source, DLRM's interaction input):
    its output and both inputs' gradients are bitwise those of the expand + concatenation it
    replaces (the rows' duplicates summed in the same order; fp32 sums for 16-bit rows), also
    where each feature's row comes in column shards narrower than the leading row."""
    g = torch.Generator().manual_seed(0)
    B, F, U, D = 64, 5, 23, 8
    index = torch.randint(0, U, (B, F * shards), generator=g)  # duplicates everywhere
    leading0 = torch.randn(B, D, generator=g).to(dtype)
    rows0 = torch.randn(U, D // shards, generator=g).to(dtype)
    grad = torch.randn(B, 1 + F, D, generator=g).to(dtype) * 100
    outs, grads = [], []
    def behind(leading, rows, index):  # the gather's table holds the B·shards leading rows first
        return expand.ExpandRowsBehind.apply(leading, rows, index + B * shards)

    for fn in (_behind_the_old_way, behind):
        leading, rows = leading0.clone().requires_grad_(), rows0.clone().requires_grad_()
        out = fn(leading, rows, index)
        out.backward(grad)
        outs.append(out.detach())
        grads.append((leading.grad, rows.grad))
    assert outs[1].shape == (B, 1 + F, D) and outs[1].dtype == dtype
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert grads[1][1].dtype == dtype


def test_expanded_rows_gather_once_either_way():
    """`ExpandedRows` gathers its values when first read (as the eager expand did); `behind`
    gathers the rows behind a leading row instead, and declines once the values were read
    (no second gather), or for leading rows of another dtype (a concatenation would promote)
    or of a width that is no whole number of the rows'."""
    rows = torch.arange(12.0).view(6, 2)
    index = torch.tensor([[5, 0, 2], [1, 1, 4]])
    kt = pooled_source.ExpandedRows(["a", "b", "c"], [2, 2, 2], rows, lambda offset: index + offset, index.shape)
    leading = torch.full((2, 2), -1.0)
    assert kt.behind(leading.double()) is None and kt.behind(torch.ones(2, 3)) is None
    assert kt.behind(torch.ones(2, 4)) is None  # 3 blocks of 2 are no whole number of rows of 4
    assert kt._expanded is None
    combined = kt.behind(leading)
    assert torch.equal(combined, torch.cat((leading.unsqueeze(1), rows[index]), 1))
    assert kt._expanded is None  # not gathered for the values too
    assert torch.equal(kt.values(), rows[index].view(2, 6))
    assert torch.equal(kt.to_dict()["b"], rows[index[:, 1]])
    assert kt.behind(leading) is None
