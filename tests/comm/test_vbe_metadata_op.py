"""The CPU kernel of `fbgemm::generate_vbe_metadata` that `comm.dedup_at: source` registers
(torchrec_hooks.vbe_metadata): the same outputs as fbgemm 1.8's CPU kernel, which it replaces
because that one indexes tensors bag by bag (~0.5 s a call at 36k bags)."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.comm import torchrec_hooks as hooks


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
    fbgemm_own = None if hooks._VBE_KERNELS else torch.ops.fbgemm.generate_vbe_metadata(*args)
    hooks.register_cpu_vbe_metadata()
    rows, b_t_map = torch.ops.fbgemm.generate_vbe_metadata(*args)
    ref_rows, ref_bt = _loop_reference(*args)
    assert rows.dtype == torch.int64 and b_t_map.dtype == torch.int32
    assert torch.equal(rows, ref_rows) and torch.equal(b_t_map, ref_bt)
    if fbgemm_own is not None:  # this process still had fbgemm's kernel: compare with it too
        assert torch.equal(rows, fbgemm_own[0]) and torch.equal(b_t_map, fbgemm_own[1])


def test_preallocated_output_offsets_pass_through_and_registering_twice_is_one_kernel():
    args = _args([[2, 1], [1, 2]], [8, 8])
    given = torch.arange(6, dtype=torch.int64)
    hooks.register_cpu_vbe_metadata()
    hooks.register_cpu_vbe_metadata()
    assert len(hooks._VBE_KERNELS) == 1
    rows, _ = torch.ops.fbgemm.generate_vbe_metadata(*args, given)
    assert rows is given or torch.equal(rows, given)


def test_expand_rows_sums_duplicate_gradients_in_fp32_for_16_bit_rows():
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16, requires_grad=True)
    index = torch.tensor([1, 0, 1, 1])
    out = hooks.ExpandRows.apply(rows, index)
    assert torch.equal(out, rows.detach()[index])
    # 256 + 1 + 1 in bf16 pairwise would lose the ones; summed in fp32 it is 258
    out.backward(torch.tensor([[256.0, 0.0], [5.0, 5.0], [1.0, 0.0], [1.0, 0.0]], dtype=torch.bfloat16))
    assert rows.grad.dtype == torch.bfloat16
    assert rows.grad.float().tolist() == [[5.0, 5.0], [258.0, 0.0]]
