"""LOSSY baselines: TorchRec's own quantized comms (`fp16`, `bf16`, `int8`, `fp8`).

These exist to compare against, not to train MLPerf runs with: every pooled
embedding (forward) and its gradient (backward) is rounded to the wire
precision, so training differs from `none`. TorchRec does the work: the run's
`QCommsConfig` becomes a `qcomm_codecs_registry` handed to the EBC sharder,
and TorchRec's stock dists quantize inside their collectives. Our part is the
name (its facts, `fp8` on GPU only among them: declarations.BUILT_IN), and byte counters: the
message size of these codecs is a pure function of the shape, so a thin
wrapper around the stock dist counts it from the batch sizes alone.

One deliberate difference from `get_qcomm_codecs_registry`: on CPU it turns
BF16 into FP16 because old Gloo lacked bf16 collectives; Gloo in torch 2.13
carries bf16 all-to-alls (checked), so `bf16` here really is bf16 everywhere.
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.nn as nn
from torchrec.distributed.embedding_sharding import EmbeddingShardingContext
from torchrec.distributed.fbgemm_qcomm_codec import (
    CommType,
    QCommsConfig,
    get_qcomm_codecs,
    get_qcomm_codecs_registry,
)
from torchrec.distributed.types import Awaitable, CommOp, QuantizedCommCodecs

from dlrmtrain.comm.codec import CollectionKind, DistSpec, EmbeddingCommCodec
from dlrmtrain.comm.codec_choice import check_device
from dlrmtrain.comm.declarations import BUILT_IN
from dlrmtrain.comm.layout import DistLayout
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.comm.stock_bytes import count_stock_step
from dlrmtrain.comm.torchrec.sharded import qcomm_codecs

logger = logging.getLogger(__name__)

def bytes_per_value(codecs: QuantizedCommCodecs, like: torch.Tensor) -> float:
    """Bytes on the wire per float: encode one quantization row and measure it."""
    ctx = codecs.forward.create_context()
    row = max(getattr(ctx, "row_dim", 1) or 1, 1)
    return codecs.forward.encode(like.new_zeros(row), ctx).nbytes / row


class LossyQCommsCodec(EmbeddingCommCodec):
    """Registry entry for one TorchRec qcomms precision (same precision both ways)."""

    def __init__(self, name: str, comm_type: CommType) -> None:
        self.declare(BUILT_IN[name])
        self.comm_type = comm_type

    def supports(self, sharding_type: str, kind: CollectionKind = "pooled") -> bool:
        return True  # TorchRec's qcomms cover every pooled- and sequence-embedding dist

    def qcomms_config(self) -> QCommsConfig | None:
        return QCommsConfig(forward_precision=self.comm_type, backward_precision=self.comm_type)

    def qcomm_codecs_registry(self, device_type: str) -> dict[str, QuantizedCommCodecs] | None:
        """`qcomm_codecs_registry` for TorchRec's sharder (keyed by CommOp name)."""
        check_device(self.declaration, device_type)  # fp8: GPU only
        config = self.qcomms_config()
        if device_type == "cuda":
            registry = get_qcomm_codecs_registry(config, device=torch.device("cuda"))
        else:
            # TorchRec's CPU path would silently turn bf16 into fp16 (see module docstring)
            ops = (CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL, CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER,
                   CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL)
            registry = {op.name: get_qcomm_codecs(copy.deepcopy(config)) for op in ops}
        if self.comm_type == CommType.INT8:
            # TorchRec 1.8's reduce-scatter calls the int8 quantizer without its row context and
            # crashes; like TorchRec's own fp8 fallback there, row-wise tables travel in fp16
            logger.warning("comm.codec=int8: row-wise tables, if any (reduce-scatter), use fp16 instead; "
                           "TorchRec 1.8 cannot reduce-scatter int8")
            registry[CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER.name] = get_qcomm_codecs(
                QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.FP16))
        return registry

    def wire_bytes_per_value(self) -> float:
        """Measured from fbgemm's encoder (int8: a 32-value row plus its scale and bias)."""
        return bytes_per_value(self.qcomm_codecs_registry("cpu")["POOLED_EMBEDDINGS_ALL_TO_ALL"],
                               torch.zeros(0))

    def make_output_dist(self, spec: DistSpec) -> nn.Module:
        codecs = qcomm_codecs(spec.stock_dist)
        if spec.kind != "pooled" or not isinstance(spec.layout, DistLayout) or codecs is None:
            return spec.stock_dist  # still quantized by TorchRec; only the counters are skipped
        return CountingLossyDist(spec, codecs, self.name)


class CountingLossyDist(nn.Module):
    """TorchRec's quantizing dist, unchanged, plus per-table byte counters.

    Bytes per block are its elements times the codec's bytes per element,
    measured once by encoding one quantization row (fp16/bf16: 2; int8: 40
    bytes per 32 values, a scale and bias per row), as TorchRec sizes its all-to-all.
    """

    def __init__(self, spec: DistSpec, codecs: QuantizedCommCodecs, name: str) -> None:
        super().__init__()
        self.inner = spec.stock_dist
        self.layout = spec.layout
        self.rank = spec.rank
        self.codecs = codecs
        self.bytes_per_element: float | None = None
        self.comm_stats = DistCommStats(codec=name, sharding_type=spec.sharding_type, lossy=True,
                                        table_codecs={t: name for t in spec.all_tables()})

    def forward(self, local_embs: torch.Tensor,
                sharding_ctx: EmbeddingShardingContext | None = None) -> Awaitable[torch.Tensor]:
        sizes = list(getattr(sharding_ctx, "batch_size_per_rank", None) or [])
        W = self.layout.world_size
        if not sizes:
            sizes = [local_embs.shape[0] // W] * W if local_embs.ndim == 2 else [0] * W
        if self.bytes_per_element is None:
            self.bytes_per_element = bytes_per_value(self.codecs, local_embs)
        count_stock_step(self.comm_stats, self.layout, self.rank, sizes, local_embs.element_size(),
                         wire=self.bytes_per_element)  # the stock dist's rows, at the codec's width
        return self.inner(local_embs, sharding_ctx)

    def counted_bytes(self) -> DistCommStats:
        """`stats.CountsCommBytes`"""
        return self.comm_stats
