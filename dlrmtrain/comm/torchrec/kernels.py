"""fbgemm's lookup kernels inside a sharded module, made to emit on CPU the dtype they were asked
for (TorchRec privates: the sharded modules' `_lookups`; fbgemm's kernels' `output_dtype`)."""

from __future__ import annotations

import functools
from typing import Any

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


def round_cpu_lookups(model: nn.Module) -> int:
    """Make each CPU lookup kernel of `model` asked for bf16 rows emit them as the GPU's does:
    it sums a bag's fp32 rows in fp32 and its output is rounded once to bf16 (one forward hook);
    the bf16 gradient that comes back is widened to fp32 for its backward, which accumulates in
    fp32 on both devices. So the embedding all-to-all carries bf16 on CPU as on GPU, wherever
    the lookup runs. Returns how many kernels it changed."""
    rounded = 0
    for kernel in _lookup_kernels(model):
        if isinstance(kernel, _KERNELS) and kernel.use_cpu and kernel.output_dtype in _CPU_ROUNDED:
            dtype = _CPU_ROUNDED[kernel.output_dtype]
            kernel.output_dtype = SparseType.FP32.as_int()
            kernel.register_forward_hook(functools.partial(_rounded_output, dtype=dtype))
            rounded += 1
    return rounded


def _lookup_kernels(model: nn.Module):
    """Every module under each sharded EBC's or EC's lookups (`_lookups` is a plain list:
    not reached by `model.modules()`)."""
    for sharded in model.modules():
        if isinstance(sharded, (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection)):
            for lookup in sharded._lookups:
                yield from lookup.modules()


def _rounded_output(_kernel: nn.Module, _inputs: Any, output: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return output.to(dtype)
