"""DLRM v1 (dot interaction) and DLRM-DCNv2 (low-rank cross net), from torchrec.models.dlrm.

The embedding tables are created on the meta device: DistributedModelParallel
materialises only each rank's shards. Layer counts follow MLPerf even when a
config scales widths down, so the MLPerf log can name every layer.

Sparse first: the forward starts the embedding lookup and its output
all-to-all (under sharding the EBC returns a LazyAwaitable with the transfer in
flight) before the bottom MLP, and waits for the rows only at the
interaction, so the bottom MLP runs while they travel. The math is the same
(same ops on the same values; the old order stays as `sparse_first = False`).
In backward nothing needs reordering: autograd runs ready nodes newest first.
The all-to-all's wait half is created at the interaction, so its backward
(which launches the gradient all-to-all) runs right after the interaction's,
in either order; its start half (which waits for the gradients and hands them
to the embedding update) was created before the bottom MLP, so it runs after
the bottom MLP's backward. Under torchrec's order it was created after the
bottom MLP and waited at once, before it (tests/multiproc/test_overlap.py
checks both sequences).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchrec.distributed.types import Awaitable
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain, InteractionArch, InteractionDCNArch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedTensor

from dlrmtrain.config.schema import Config
from dlrmtrain.features import CAT_KEYS, TABLE_NAMES
from dlrmtrain.rows_behind import RowsBehind


def table_configs(rows: list[int], embedding_dim: int) -> list[EmbeddingBagConfig]:
    return [EmbeddingBagConfig(name=table, embedding_dim=embedding_dim,
                               num_embeddings=n, feature_names=[key])
            for table, key, n in zip(TABLE_NAMES, CAT_KEYS, rows, strict=True)]


def _mlperf_v1_linear_init(module: nn.Module) -> None:
    """The MLPerf DLRM v1 reference's MLP init: W ~ N(0, sqrt(2 / (fan_in + fan_out))),
    b ~ N(0, sqrt(1 / fan_out))."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            fan_out, fan_in = layer.weight.shape
            with torch.no_grad():
                layer.weight.normal_(0.0, math.sqrt(2.0 / (fan_in + fan_out)))
                layer.bias.normal_(0.0, math.sqrt(1.0 / fan_out))


def _arrived(pooled):
    """The lookup's output, its rows arrived: sharded, TorchRec's EBC hands back an `Awaitable`
    (the all-to-all in flight), waited for here, at the interaction (reading it would wait too)."""
    return pooled.wait() if isinstance(pooled, Awaitable) else pooled


def _pooled_rows(sparse_arch: nn.Module, pooled) -> torch.Tensor:
    """SparseArch's forward after the lookup: [B, F, D] in feature order.

    A KeyedTensor already in feature order (dedup at the source expands the rows into it) is
    viewed, not copied: the reorder is a copy of B·F·D values forward and again backward. Any
    other output (a pipeline's trace hands a stand-in) is reordered by name."""
    if isinstance(pooled, KeyedTensor) and pooled.keys() == list(sparse_arch.sparse_feature_names) \
            and pooled.values().size(1) == sparse_arch.F * sparse_arch.D:
        return pooled.values().reshape(-1, sparse_arch.F, sparse_arch.D)
    by_name = pooled.to_dict()
    return torch.cat([by_name[name] for name in sparse_arch.sparse_feature_names],
                     dim=1).reshape(-1, sparse_arch.F, sparse_arch.D)


def _dense_and_pooled_rows(dlrm: nn.Module, pooled, dense: torch.Tensor) -> torch.Tensor | None:
    """[B, 1 + F, D]: each sample's dense row, then its pooled rows in feature order (what the
    interaction concatenates), gathered in one op where the lookup's output is a `RowsBehind`
    (rows_behind.py: dedup at the source, the rows not expanded yet), else None. Only for
    torchrec's own two interactions (`_interact`), the output's keys in the model's order."""
    if not isinstance(pooled, RowsBehind) or type(dlrm.inter_arch) not in (InteractionArch, InteractionDCNArch) \
            or dlrm.inter_arch.F <= 0:
        return None
    sparse_arch = dlrm.sparse_arch
    if pooled.keys() != list(sparse_arch.sparse_feature_names) \
            or pooled.length_per_key() != [sparse_arch.D] * sparse_arch.F:
        return None
    return pooled.behind(dense)


def _interact(inter_arch: nn.Module, dense: torch.Tensor, combined: torch.Tensor) -> torch.Tensor:
    """torchrec's `InteractionArch` / `InteractionDCNArch` forward from its concatenation on:
    `combined` = cat((dense.unsqueeze(1), sparse), 1); the same ops, so bitwise its forward
    (tests/models/test_dlrm_pooled_rows.py compares the two)."""
    if type(inter_arch) is InteractionDCNArch:
        return inter_arch.crossnet(combined.reshape([dense.size(0), -1]))
    interactions = torch.bmm(combined, torch.transpose(combined, 1, 2))
    flat = interactions[:, inter_arch.triu_indices[0], inter_arch.triu_indices[1]]
    return torch.cat((dense, flat), dim=1)


class _SparseFirst:
    """DLRM's forward with the embedding all-to-all in flight during the bottom MLP."""

    sparse_first = True
    """False: torchrec's order (bottom MLP, then lookup and all-to-all, waited at once)"""

    def forward(self, dense_features: torch.Tensor, sparse_features) -> torch.Tensor:
        if not self.sparse_first:
            return super().forward(dense_features, sparse_features)
        pooled = self.sparse_arch.embedding_bag_collection(sparse_features)  # not waited yet
        embedded_dense = self.dense_arch(dense_features)
        pooled = _arrived(pooled)  # the wait
        combined = _dense_and_pooled_rows(self, pooled, embedded_dense)
        if combined is not None:
            return self.over_arch(_interact(self.inter_arch, embedded_dense, combined))
        embedded_sparse = _pooled_rows(self.sparse_arch, pooled)
        return self.over_arch(self.inter_arch(dense_features=embedded_dense,
                                              sparse_features=embedded_sparse))


class SparseFirstDLRM(_SparseFirst, DLRM):
    """DLRM v1 (dot interaction), sparse first."""


class SparseFirstDLRM_DCN(_SparseFirst, DLRM_DCN):
    """DLRM-DCNv2 (low-rank cross net), sparse first."""


class Fp32LogitLayer(nn.Linear):
    """The top MLP's last Linear, computed in fp32 even under bf16 autocast, so the eval
    AUC ranks fp32 scores (bf16 logits tie; dlrmtrain/precision.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return super().forward(x.float())


def _fp32_logit_layer(over_arch: nn.Module) -> None:
    """Swap in the fp32 logit layer with the same weights (and state-dict names)."""
    last = over_arch.model[-1]
    fp32 = nn.utils.skip_init(Fp32LogitLayer, last.in_features, last.out_features,
                              device=last.weight.device)  # draws no random numbers
    fp32.load_state_dict(last.state_dict())
    over_arch.model[-1] = fp32


def set_sparse_first(model: nn.Module, on: bool) -> int:
    """Switch every DLRM in `model` (sharded or not) to sparse-first (True) or torchrec's
    order (False); returns how many were switched."""
    found = [m for m in model.modules() if isinstance(m, _SparseFirst)]
    for m in found:
        m.sparse_first = on
    return len(found)


def build_model(cfg: Config, rows: list[int], dense_device: torch.device, cross_net: bool) -> DLRMTrain:
    """The training module (model + BCE loss) with its tables on the meta device.

    `cross_net` False: dot interaction, the MLPs initialised as the MLPerf v1 reference;
    True: DCNv2's low-rank cross net (model.dcn_*), torchrec's init (the MLPerf DCNv2
    reference's). Which one a config runs is its workload's (workloads/dlrm.py).
    Dense layers are initialised from `run.seed`, identically on every rank.
    """
    m = cfg.model
    ebc = EmbeddingBagCollection(tables=table_configs(rows, m.embedding_dim),
                                 device=torch.device("meta"))
    torch.manual_seed(cfg.run.seed)
    common = dict(embedding_bag_collection=ebc,
                  dense_in_features=cfg.data.num_dense_features,
                  dense_arch_layer_sizes=list(m.bottom_mlp),
                  over_arch_layer_sizes=list(m.top_mlp),
                  dense_device=dense_device)
    if not cross_net:
        dlrm = SparseFirstDLRM(**common)
        _mlperf_v1_linear_init(dlrm.dense_arch)
        _mlperf_v1_linear_init(dlrm.over_arch)
    else:  # torchrec's defaults are the MLPerf DCNv2 reference's init
        dlrm = SparseFirstDLRM_DCN(dcn_num_layers=m.dcn_num_layers, dcn_low_rank_dim=m.dcn_low_rank_dim,
                        **common)
        dlrm.inter_arch.to(dense_device)
    _fp32_logit_layer(dlrm.over_arch)
    return DLRMTrain(dlrm)
