"""fbgemm's variable-batch (VBE) metadata kernel, replaced on CPU by whole-tensor ops."""

from __future__ import annotations

import torch


def vbe_metadata(B_offsets: torch.Tensor, B_offsets_rank_per_feature: torch.Tensor,
                 output_offsets_feature_rank: torch.Tensor, D_offsets: torch.Tensor, D: int, nobag: bool,
                 max_B_feature_rank: int, info_B_num_bits: int, total_B: int,
                 vbe_output_offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fbgemm's `generate_vbe_metadata` (its CPU kernel's outputs, fbgemm_gpu 1.8) in whole-tensor ops.

    fbgemm's CPU kernel indexes tensors element by element (two tensor ops per bag: ~0.5 s a
    call at 36k bags, ~3 ms here). Bag i (feature t, sample rank r, its b-th bag there, in
    (t, r, b) order) gets `row_output_offsets[i]` = the (r, t) block's output offset + b·D_t and
    `b_t_map[i]` = t << info_B_num_bits | (its bag number within feature t)."""
    del D, nobag, max_B_feature_rank  # the CPU kernel reads neither
    T = B_offsets.numel() - 1
    ranks = B_offsets_rank_per_feature.size(1) - 1
    starts = B_offsets_rank_per_feature.to(torch.int64)
    sizes = (starts[:, 1:] - starts[:, :-1]).reshape(-1)  # per (t, r), t major: bag order
    n = int(total_B)
    block = torch.repeat_interleave(torch.arange(T * ranks), sizes, output_size=n)
    feature, rank = block // ranks, block % ranks
    b = torch.arange(n) - (torch.cumsum(sizes, 0) - sizes)[block]
    dims = (D_offsets[1:] - D_offsets[:-1]).to(torch.int64)
    row_output_offsets = (output_offsets_feature_rank[rank * T + feature] + b * dims[feature]
                          ).to(output_offsets_feature_rank.dtype)
    b_t_map = ((feature << info_B_num_bits) | (starts[:, :-1].reshape(-1)[block] + b)).to(torch.int32)
    return (row_output_offsets if vbe_output_offsets is None else vbe_output_offsets), b_t_map


_VBE_KERNELS: list[torch.library.Library] = []
"""the library handle of the CPU `generate_vbe_metadata` kernel, kept alive"""


def register_cpu_vbe_metadata() -> None:
    """Replace fbgemm's CPU kernel of `fbgemm::generate_vbe_metadata` (called by the CPU TBE's
    variable-batch forward) with `vbe_metadata`, the same outputs; idempotent. CUDA keeps fbgemm's."""
    if _VBE_KERNELS:
        return
    import warnings

    import fbgemm_gpu  # noqa: F401 - declares the op and its CPU kernel

    lib = torch.library.Library("fbgemm", "IMPL")
    with warnings.catch_warnings():  # "overriding a previously registered kernel": that is the point
        warnings.simplefilter("ignore")
        lib.impl("generate_vbe_metadata", vbe_metadata, "CPU")
    _VBE_KERNELS.append(lib)
