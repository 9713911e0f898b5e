"""DLRMv4: the HSTU ranking model of the MLPerf reference (mlcommons/training
`recommendation_v4`, PR #889: `modules/dlrm_hstu.py`), single-device.

One forward, per sample: the history (item, artist, album rows with their actions
and timestamps) and the candidate are merged into one jagged sequence; the
contextual preprocessor maps it to width D and puts the contextual tokens (uid and
the hashed crosses) in front; positions and time buckets are added; the STU layers
run with the causal, target-aware mask; the candidate's output row, postprocessed,
is the user embedding. The candidate's own tables through the item MLP give the
item embedding, and user ⊙ item gives the listen_plus logit.

`forward(batch)` returns `(loss, (loss.detach(), logits.detach(), labels))` like
TorchRec's DLRMTrain, so the trainer treats both model families alike. The tables
(`embedding_collection`) are built on the meta device for training: sharding wraps
the model from outside (DistributedModelParallel) and materialises them.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import nn
from torch.nn import functional as F
from torchrec.sparse.jagged_tensor import JaggedTensor

from dlrmtrain.config.schema import Config, HSTUConfig
from dlrmtrain.models.hstu import jagged
from dlrmtrain.models.hstu.attention import kinds
from dlrmtrain.models.hstu.head import PredictionHead, item_mlp, weighted_bce
from dlrmtrain.models.hstu.positional import PositionalEncoder
from dlrmtrain.models.hstu.postprocessor import build_postprocessor
from dlrmtrain.models.hstu.preprocessor import ContextualPreprocessor, PreprocessorSpec
from dlrmtrain.models.hstu.stu import STULayer, STUStack
from dlrmtrain.models.hstu.tables import embedding_collection, hstu_table_rows
from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES, UIH_TO_CANDIDATE, SequenceBatch

EMBEDDING_COLLECTION = "embedding_collection"
"""The model's attribute (and module path) holding the tables, for the sharder."""

HISTORY_ITEM = "item_id"
"""The history feature the content MLP reads (the reference's uih_post_id_feature_name)."""
HISTORY_ADDITIONAL = ["artist_id", "album_id"]
"""Further embedded history features, through the additional MLP (reference order)."""
CANDIDATE_OF = dict(UIH_TO_CANDIDATE)
"""History feature → the candidate feature with the same meaning."""
ITEM_FEATURES = [CANDIDATE_OF[f] for f in [HISTORY_ITEM, *HISTORY_ADDITIONAL]]
"""The candidate features the item MLP reads, concatenated in this order."""
ACTION_BITS = [1, 2, 4]
"""listen_plus, like, skip: the action bits the history's `action_weight` carries."""


def _row_per_sample(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """A contextual feature's [B, E] rows (zeros where a sample lacks it), as the
    reference's jagged_to_padded_dense with max length 1."""
    return jagged.to_padded(values, jagged.offsets_of(lengths), 1).squeeze(1)


class DlrmHSTU(nn.Module):
    def __init__(self, hstu: HSTUConfig, table_dim: int, rows: Mapping[str, int],
                 table_device: torch.device, dense_device: torch.device,
                 bf16_user_tower: bool = False) -> None:
        super().__init__()
        self.bf16_user_tower = bf16_user_tower
        self.max_seq_len = hstu.max_seq_len
        self.input_dropout = hstu.input_dropout
        self.loss_weight = hstu.loss_weight
        self.embedding_collection = embedding_collection(dict(rows), table_dim, table_device)
        with torch.device(dense_device):
            self.preprocessor = ContextualPreprocessor(PreprocessorSpec(
                table_dim, hstu.preprocessor_hidden_dim, hstu.dim, len(CONTEXTUAL_FEATURES),
                len(HISTORY_ADDITIONAL), ACTION_BITS, hstu.action_embedding_dim,
                hstu.action_embedding_init_std))
            self.positional = PositionalEncoder(hstu.num_position_buckets, hstu.num_time_buckets,
                                                hstu.dim, len(CONTEXTUAL_FEATURES))
            kind = kinds.resolve(hstu.attention, dense_device.type, hstu.max_seq_len)
            self.stu = STUStack([STULayer(hstu.dim, hstu.num_heads, hstu.attn_qk_dim,
                                          hstu.attn_linear_dim, hstu.linear_dropout, kind)
                                 for _ in range(hstu.num_layers)])
            self.postprocessor = build_postprocessor(hstu.postprocessor, hstu.dim)
            self.item_mlp = item_mlp(table_dim, len(ITEM_FEATURES), hstu.item_mlp_hidden_dim,
                                     hstu.dim)
            self.head = PredictionHead(hstu.dim, hstu.head_hidden_dim)
        # The reference's HSTUTransducer re-initialises every Linear of its pre- and
        # postprocessor (not the STU layers) with Xavier-normal weights.
        for part in (self.preprocessor, self.postprocessor):
            for m in part.modules():
                if isinstance(m, nn.Linear):
                    nn.init.xavier_normal_(m.weight)

    def forward(self, batch: SequenceBatch
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        # The sharded lookup on a plain attribute of the batch, the rest one opaque call:
        # so TorchRec's pipelines can fx-trace this forward, find the lookup's input and
        # run its input all-to-all ahead (the rest reads host values fx cannot trace).
        emb = self.embedding_collection(batch.sparse)
        return _loss_and_outputs(self, batch, emb)

    def loss_and_outputs(self, batch: SequenceBatch, emb: Mapping[str, JaggedTensor]
                         ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.logits_of(batch, emb)
        labels = batch.labels().to(logits.device)
        loss = weighted_bce(logits, labels, self.loss_weight)
        return loss, (loss.detach(), logits.detach(), labels)

    def logits(self, batch: SequenceBatch) -> torch.Tensor:
        """[candidates] listen_plus logits, in candidate order."""
        return self.logits_of(batch, self.embedding_collection(batch.sparse))

    def logits_of(self, batch: SequenceBatch, emb: Mapping[str, JaggedTensor]) -> torch.Tensor:
        """The logits from the batch's looked-up rows, computed in fp32: only the user tower
        runs under bf16 autocast (when `bf16_user_tower`), as the reference's
        `_user_forward`; the item MLP and the head see fp32, so the AUC ranks fp32 scores."""
        device_type = emb[HISTORY_ITEM].values().device.type
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16,
                            enabled=self.bf16_user_tower):
            user = self.user_embeddings(batch, emb)
        item = self.item_mlp(torch.cat([emb[f].values() for f in ITEM_FEATURES], dim=1))
        return self.head(user.float(), item)

    def _max_len(self, history_lengths: torch.Tensor, num_targets: torch.Tensor) -> int:
        max_len = (int(history_lengths.max()) + int(num_targets.max())
                   + len(CONTEXTUAL_FEATURES))  # one host sync, as the reference
        if max_len > self.max_seq_len:
            raise ValueError(f"a sample's sequence ({max_len} rows: contextual + history + "
                             f"candidates) exceeds model.hstu.max_seq_len {self.max_seq_len}; "
                             f"the data must truncate histories to fit")
        return max_len

    def user_embeddings(self, batch: SequenceBatch, emb: Mapping[str, JaggedTensor]) -> torch.Tensor:
        """The user tower (the reference's HSTU transducer): [candidates, D], one row per
        candidate, its history and contextual tokens through the STU layers."""
        history_lengths = emb[HISTORY_ITEM].lengths()
        candidates = emb[CANDIDATE_OF[HISTORY_ITEM]]
        num_targets, total_targets = candidates.lengths(), candidates.values().shape[0]
        max_len = self._max_len(history_lengths, num_targets)

        def merged(values_of_history: torch.Tensor, values_of_candidates: torch.Tensor):
            return jagged.concat(values_of_history, history_lengths, values_of_candidates,
                                 num_targets)

        def merged_embedding(feature: str) -> torch.Tensor:
            return merged(emb[feature].values(), emb[CANDIDATE_OF[feature]].values())

        items = merged_embedding(HISTORY_ITEM)
        additional = torch.cat([merged_embedding(f) for f in HISTORY_ADDITIONAL], dim=1)
        timestamps = merged(batch.uih["action_timestamp"].values(),
                            batch.candidates[CANDIDATE_OF["action_timestamp"]].values())
        contextual = torch.stack([_row_per_sample(emb[f].values(), emb[f].lengths())
                                  for f in CONTEXTUAL_FEATURES], dim=1)
        seq, lengths, timestamps = self.preprocessor(
            items, additional, batch.uih["action_weight"].values(), contextual,
            history_lengths + num_targets, num_targets, timestamps, total_targets)

        offsets = jagged.offsets_of(lengths)
        seq = self.positional(seq, offsets, lengths, num_targets, timestamps, max_len)
        seq = F.dropout(seq, p=self.input_dropout, training=self.training)
        seq = self.stu(seq, offsets, lengths, num_targets, max_len)

        history_and_context = lengths - num_targets
        _, user = jagged.split(seq, history_and_context, num_targets, total_targets)
        _, query_time = jagged.split(timestamps, history_and_context, num_targets, total_targets)
        return self.postprocessor(user, query_time)


@torch.fx.wrap
def _loss_and_outputs(model: DlrmHSTU, batch: SequenceBatch, emb: Mapping[str, JaggedTensor]):
    """`DlrmHSTU.loss_and_outputs`, a leaf for fx: traced, it is one call node."""
    return model.loss_and_outputs(batch, emb)


def build_hstu_model(cfg: Config, dense_device: torch.device,
                     rows: Optional[Mapping[str, int]] = None,
                     table_device: torch.device = torch.device("meta")) -> DlrmHSTU:
    """The DLRMv4 training module. Dense layers are initialised from `run.seed`, the
    same on every rank (the reference draws the same distributions in another module
    order, so one seed gives other starting weights than its); tables stay on
    `table_device` (meta: for DMP to materialise). `precision.mode: bf16` puts the user
    tower under bf16 autocast (dlrmtrain/precision.py).
    `rows`: table → rows (default: the reference's, capped at model.max_table_rows)."""
    if rows is None:
        rows = hstu_table_rows(cfg.model.max_table_rows)
    torch.manual_seed(cfg.run.seed)
    return DlrmHSTU(cfg.model.hstu, cfg.model.embedding_dim, rows, table_device, dense_device,
                    bf16_user_tower=cfg.precision.mode == "bf16")
