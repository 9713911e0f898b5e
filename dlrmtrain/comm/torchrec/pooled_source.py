"""The stock sharded EmbeddingBagCollection under dedup at the source (TorchRec privates, pooled, VBE).

The batch itself takes TorchRec's public variable-batch form (comm/dedup/source.py); only
these are private: row-wise variable-batch dists over Gloo, and the expand of the distinct
bags' rows in one row gather (its autograd math: comm/dedup/expand.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.comm_ops import Request, ReduceScatterV_Wait, reduce_scatter_v_per_feature_pooled
from torchrec.distributed.dist_data import (
    PooledEmbeddingsAwaitable,
    PooledEmbeddingsReduceScatter,
    VariableBatchPooledEmbeddingsReduceScatter,
)
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionContext,
    ShardedEmbeddingBagCollection,
    VariableBatchEmbeddingBagCollectionAwaitable,
)
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingDist
from torchrec.sparse.jagged_tensor import KeyedTensor

from dlrmtrain.comm.dedup.expand import ExpandRows, ExpandRowsBehind
from dlrmtrain.comm.torchrec.sharded import output_dists, replace_output_dist
from dlrmtrain.rows_behind import RowsBehind


# Row-wise tables at the source. TorchRec's variable-batch row-wise output dist reduce-scatters
# each sample rank's rows (uneven sizes: Gloo takes them), and its backward
# (`ReduceScatterV_Wait.backward`) all-gathers the gradient in those uneven sizes with
# `dist.all_gather`, which Gloo refuses ("all inputs must have the same size"). On Gloo the
# backward below gathers every rank's part padded to the longest (one even
# `all_gather_into_tensor`) and keeps each rank's own; NCCL takes the uneven all-gather. And
# TorchRec's dist serves one batch kind only (the first call's), where `auto` at the source
# sends both.
class _UnpadWork:
    """The padded all-gather's work: `wait` copies each rank's part out of its padded slot."""

    def __init__(self, work: dist.Work, gathered: torch.Tensor, parts: list[torch.Tensor]) -> None:
        self.work, self.gathered, self.parts = work, gathered, parts

    def wait(self) -> bool:
        self.work.wait()
        for part, slot in zip(self.parts, self.gathered.view(len(self.parts), -1)):
            part.copy_(slot[:part.numel()])
        return True


class _EvenAllGatherWait(ReduceScatterV_Wait):
    """`ReduceScatterV_Wait` whose backward all-gathers the 1-d gradient padded to the longest
    part (the variable-batch dist's `input_splits`, elements per rank; no codecs at the source)."""

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        myreq = ctx.myreq
        splits = list(myreq.rsi.input_splits)
        longest = max(splits)
        padded = grad_output.new_zeros(longest)
        padded[:grad_output.numel()] = grad_output.reshape(-1)
        gathered = grad_output.new_empty(len(splits) * longest)
        work = dist.all_gather_into_tensor(gathered, padded, group=ctx.pg, async_op=True)
        grad_input = grad_output.new_empty(myreq.rsi.total_input_size)
        myreq.req = _UnpadWork(work, gathered, list(torch.split(grad_input, splits)))
        myreq.tensor = grad_input
        return (None, None, myreq.dummy_tensor)


class _EvenGatherVariableBatchReduceScatter(VariableBatchPooledEmbeddingsReduceScatter):
    """TorchRec's variable-batch reduce-scatter, its backward gathering evenly (`_EvenAllGatherWait`)."""

    def forward(self, local_embs: torch.Tensor, batch_size_per_rank_per_feature: list[list[int]],
                embedding_dims: list[int]) -> PooledEmbeddingsAwaitable:
        request = reduce_scatter_v_per_feature_pooled(local_embs, batch_size_per_rank_per_feature,
                                                      embedding_dims, self._pg, self._codecs)
        if isinstance(request, Request):  # else one rank, or synchronous collectives: no all-gather
            request.wait_function = _EvenAllGatherWait
        return PooledEmbeddingsAwaitable(tensor_awaitable=request)


class _SourceRwPooledEmbeddingDist(RwPooledEmbeddingDist):
    """TorchRec's row-wise output dist taking a variable batch (dedup at the source) and a fixed one
    (`auto`'s `none` steps) on any call: TorchRec's builds the module of its first call's kind and
    keeps it. Over Gloo the variable-batch backward gathers evenly (`_EvenAllGatherWait`)."""

    def __init__(self, pg: dist.ProcessGroup, embedding_dims: list[int], qcomm_codecs_registry: Any,
                 even_gather: bool) -> None:
        super().__init__(pg, embedding_dims, qcomm_codecs_registry)
        variable = (_EvenGatherVariableBatchReduceScatter if even_gather
                    else VariableBatchPooledEmbeddingsReduceScatter)
        self._variable = variable(pg, self._codecs)
        self._fixed = PooledEmbeddingsReduceScatter(pg, self._codecs)

    def forward(self, local_embs: torch.Tensor, sharding_ctx=None):
        if sharding_ctx is not None and sharding_ctx.variable_batch_per_feature:
            return self._variable(local_embs, batch_size_per_rank_per_feature=sharding_ctx.batch_size_per_rank_per_feature,
                                  embedding_dims=self._embedding_dims)
        return self._fixed(local_embs, input_splits=None if sharding_ctx is None else sharding_ctx.batch_size_per_rank)


def row_wise_dists_for_source(ebc: ShardedEmbeddingBagCollection) -> int:
    """Give each stock row-wise output dist of `ebc` (no codec set) one that takes both batch kinds
    and, over Gloo, gathers the variable batch's gradient evenly; how many were given one."""
    given = 0
    for i, out_dist in enumerate(output_dists(ebc)):
        if type(out_dist) is RwPooledEmbeddingDist and out_dist._codecs is None:
            replace_output_dist(ebc, i, _SourceRwPooledEmbeddingDist(
                out_dist._pg, out_dist._embedding_dims, out_dist._qcomm_codecs_registry,
                even_gather=dist.get_backend(out_dist._pg) == "gloo"))
            given += 1
    return given


class ExpandedRows(KeyedTensor, RowsBehind):
    """The one-width expand's output: TorchRec's KeyedTensor of values [B, K·d] = `rows[index]`
    (`ExpandRows`), gathered when its values are first read; `behind(leading)` gathers the rows
    behind a leading row per sample instead (`ExpandRowsBehind`: DLRM's interaction input).
    `index_at(offset)` makes the [B, K] index (`shape`), each entry plus `offset`, when needed."""

    def __init__(self, keys: list[str], dims: list[int], rows: torch.Tensor,
                 index_at: Callable[[int], torch.Tensor], shape: tuple[int, int]) -> None:
        self._rows, self._index_at, self._shape, self._expanded = rows, index_at, shape, None
        super().__init__(keys=keys, length_per_key=dims, values=None, key_dim=1)

    @property
    def _values(self) -> torch.Tensor:
        if self._expanded is None:
            self._expanded = ExpandRows.apply(self._rows, self._index_at(0).view(-1)).view(self._shape[0], -1)
        return self._expanded

    @_values.setter
    def _values(self, values: torch.Tensor | None) -> None:
        self._expanded = values

    def behind(self, leading: torch.Tensor) -> torch.Tensor | None:
        """[B, 1 + K·d/D, D]: each sample's `leading` row [D], then its rows in the keys' order;
        None where the values were gathered already (read before), or `leading` has another
        dtype than the rows (a concatenation would promote them) or a width D that d does
        not divide or that does not divide the sample's K·d values, or another batch size."""
        (B, K), d = self._shape, self._rows.size(1)
        if self._expanded is not None or leading.dtype != self._rows.dtype or leading.dim() != 2:
            return None
        D = leading.size(1)
        if not D or leading.size(0) != B or D % d or (K * d) % D:
            return None
        return ExpandRowsBehind.apply(leading, self._rows, self._index_at(B * (D // d)))


class _RowGatherExpand(VariableBatchEmbeddingBagCollectionAwaitable):
    """TorchRec's variable-batch EBC awaitable whose expand is one row gather.

    TorchRec's expands the distinct bags' pooled rows to the batch with fbgemm's
    `batch_index_select_dim0` and then reorders the features with `permute_pooled_embs`, whose
    CPU kernels loop per feature, forward and backward. When every pooled embedding has one
    width D, the received rows are a [bags, D] matrix, and output block k of sample b is its row
    base[k] + inverse[feature of k, b]: one gather gives the output in its final order (the
    same rows: bitwise TorchRec's), and its backward sums each distinct bag's gradients in one
    `index_add`. The gather puts the features in the batch's order (TorchRec's: grouped by
    sharding type), so a model in that order views the rows instead of reordering them (a
    copy of the whole output, forward and backward). The gather waits until the output is read
    (`ExpandedRows`), so a model that puts a row before each sample's (DLRM's interaction)
    gathers both in one. Widths that differ take TorchRec's path (`RowGatherExpandShardedEBC`)."""

    def _wait_impl(self) -> KeyedTensor:
        embeddings = [w.wait() for w in self._awaitables]
        for awaitable in self._resize_awaitables or ():
            awaitable.wait()
        rows = embeddings[0] if len(embeddings) == 1 else torch.cat(embeddings)
        block_of, _, names, dims = self._expand_order
        shape = (self._inverse_indices[1].size(1), len(block_of))
        return ExpandedRows(names, dims, rows.view(-1, self._uncombined_embedding_dims[0]), self._expand_index, shape)

    def _expand_index(self, offset: int = 0) -> torch.Tensor:
        """The [B, K] index of the gather, each entry plus `offset`, in two ops: the inverse rows
        in output order, plus each block's first row and `offset` (host ints: the bag counts)."""
        block_of, feature_of, _, _ = self._expand_order
        inverse = self._inverse_indices[1]
        firsts, first = [], 0
        for bags in self._batch_size_per_feature_pre_a2a:
            firsts.append(first)
            first += bags
        base = torch.tensor([firsts[u] + offset for u in block_of])
        if inverse.device.type != "cpu":
            base = base.pin_memory().to(inverse.device, non_blocking=True)
        return inverse.t().index_select(1, feature_of).add_(base)


class RowGatherExpandShardedEBC(ShardedEmbeddingBagCollection):
    """TorchRec's sharded EBC whose variable-batch (VBE) output is expanded by `_RowGatherExpand`
    (dedup at the source). Everything else, the non-VBE path included, is TorchRec's."""

    _expand_order: tuple[list[int], torch.Tensor, list[str], list[int]] | None = None
    """output block k: (its uncombined block, its feature's inverse row, the output's names, dims)"""

    def _row_gather(self, awaitable):
        if (not isinstance(awaitable, VariableBatchEmbeddingBagCollectionAwaitable)
                or len(set(self._uncombined_embedding_dims)) != 1):
            return awaitable
        if self._expand_order is None:
            self._expand_order = self._batch_ordered_blocks(awaitable._inverse_indices)
        awaitable.__class__ = _RowGatherExpand  # same state, our `_wait_impl`
        awaitable._expand_order = self._expand_order
        return awaitable

    def _batch_ordered_blocks(self, inverse_indices) -> tuple[list[int], torch.Tensor, list[str], list[int]]:
        """The output's blocks in the batch's feature order, a feature's column shards in column
        order (TorchRec's combined order is grouped by sharding type: its block k is uncombined
        block permute[k]); the features' names and dims in that order."""
        row = {name: i for i, name in enumerate(inverse_indices[0])}
        names = self._uncombined_embedding_names
        feature = {u: row[names[u].split("@")[0]] for u in self._permute_op._permute.tolist()}
        block_of = sorted(feature, key=feature.get)  # stable: a feature's shards keep TorchRec's combined order
        feature_of = torch.tensor([feature[u] for u in block_of])
        named = sorted(zip(self._embedding_names, self._embedding_dims), key=lambda nd: row[nd[0]])
        return (block_of, feature_of.to(inverse_indices[1].device), [n for n, _ in named], [d for _, d in named])

    def output_dist(self, ctx: EmbeddingBagCollectionContext, output):
        return self._row_gather(super().output_dist(ctx, output))

    def compute_and_output_dist(self, ctx: EmbeddingBagCollectionContext, input):
        return self._row_gather(super().compute_and_output_dist(ctx, input))
