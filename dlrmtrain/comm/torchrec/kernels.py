"""What the lookups of a sharded module emit, made the dtype they were asked for on every rank
and device (TorchRec privates: the sharded modules' `_lookups` and their `_dummy_embs_tensor`;
fbgemm's kernels' `output_dtype`)."""

from __future__ import annotations

import functools
from typing import Any, Iterator

import torch
import torch.nn as nn
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    DenseTableBatchedEmbeddingBagsCodegen,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.distributed.embedding import ShardedEmbeddingCollection
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

_CPU_ROUNDED = {SparseType.BF16.as_int(): torch.bfloat16}
"""What fbgemm's CPU lookup cannot emit (`split_embedding_cpu_forward` has no BFloat16 output)."""
_KERNELS = (SplitTableBatchedEmbeddingBagsCodegen, DenseTableBatchedEmbeddingBagsCodegen)


def emit_rows_in(model: nn.Module, output_dtype: SparseType) -> int:
    """Make every lookup of `model` emit `output_dtype` (the fused params' `output_dtype`), as
    fbgemm's GPU kernels do, so that the embedding all-to-all carries it on every rank:

    - a CPU kernel asked for bf16 (which fbgemm cannot emit) sums a bag's fp32 rows in fp32
      and its output is rounded once to bf16 (a forward hook); the bf16 gradient that comes
      back is widened to fp32 for its backward, which accumulates in fp32 on both devices;
    - a lookup with no table on this rank hands the all-to-all TorchRec's empty stand-in,
      always fp32: it takes `output_dtype` too, else its rank's all-to-all buffers would
      be fp32 against its peers' bf16 rows (Gloo refuses the sizes in the backward).

    Returns how many kernels it rounds."""
    dtype = output_dtype.as_dtype()
    rounded = 0
    for lookup in _lookups(model):
        dummy = getattr(lookup, "_dummy_embs_tensor", None)
        if isinstance(dummy, torch.Tensor) and dummy.dtype != dtype:
            lookup._dummy_embs_tensor = torch.empty([0], dtype=dtype, device=dummy.device, requires_grad=True)
        for kernel in lookup.modules():
            if isinstance(kernel, _KERNELS) and kernel.use_cpu and kernel.output_dtype in _CPU_ROUNDED:
                hook = functools.partial(_rounded_output, dtype=_CPU_ROUNDED[kernel.output_dtype])
                kernel.output_dtype = SparseType.FP32.as_int()
                kernel.register_forward_hook(hook)
                rounded += 1
    return rounded


def _lookups(model: nn.Module) -> Iterator[nn.Module]:
    """Each sharded EBC's or EC's lookups (`_lookups` is a plain list: `model.modules()` misses it)."""
    for sharded in model.modules():
        if isinstance(sharded, (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection)):
            yield from sharded._lookups


def _rounded_output(_kernel: nn.Module, _inputs: Any, output: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return output.to(dtype)
