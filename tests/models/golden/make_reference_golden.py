"""Records the golden figures from the MLPerf reference's own PyTorch modules.

Not part of the test suite: it needs a checkout of the reference (see README.md here)
and `triton` importable (its modules import it even on the PyTorch kernel path).

    PYTHONPATH=.:<reference>/recommendation_v4 python tests/models/golden/make_reference_golden.py [--out FILE]

--out writes elsewhere than the committed file: the live check of README.md.

Builds the reference `DlrmHSTU` for the golden configuration (tests/models/hstu_golden.py)
in fp32 on CPU with its PyTorch kernels, gives it the golden weights under its own
parameter names, and for each golden batch records the loss, the listen_plus logits
(the prediction module's output) and every parameter's gradient after one backward.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from generative_recommenders.common import HammerKernel
from generative_recommenders.modules.dlrm_hstu import DlrmHSTU, DlrmHSTUConfig
from generative_recommenders.modules.multitask_module import MultitaskTaskType, TaskConfig
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection

from dlrmtrain.sequence_features import CONTEXTUAL_FEATURES, TABLES, UIH_TO_CANDIDATE
from tests.models.hstu_golden import (
    GOLDEN_FILE, golden_batches, golden_config, golden_parameter_names, golden_record,
    golden_weight, reference_name, table_rows)


def reference_config() -> DlrmHSTUConfig:
    h, table_dim = golden_config().model.hstu, golden_config().model.embedding_dim
    cfg = DlrmHSTUConfig(
        max_seq_len=h.max_seq_len, hstu_num_heads=h.num_heads, hstu_attn_linear_dim=h.attn_linear_dim,
        hstu_attn_qk_dim=h.attn_qk_dim, hstu_attn_num_layers=h.num_layers,
        hstu_embedding_table_dim=table_dim, hstu_preprocessor_hidden_dim=h.preprocessor_hidden_dim,
        hstu_transducer_embedding_dim=h.dim, hstu_input_dropout_ratio=h.input_dropout,
        hstu_linear_dropout_rate=h.linear_dropout, causal_multitask_weights=h.loss_weight)
    # yambda-5b's feature naming, as dlrm_v4/configs.py sets it
    cfg.user_embedding_feature_names = CONTEXTUAL_FEATURES + ["item_id", "artist_id", "album_id"]
    cfg.item_embedding_feature_names = ["item_candidate_id", "item_candidate_artist_id",
                                        "item_candidate_album_id"]
    cfg.uih_post_id_feature_name = "item_id"
    cfg.uih_action_time_feature_name = "action_timestamp"
    cfg.uih_weight_feature_name = "action_weight"
    cfg.candidates_querytime_feature_name = "item_query_time"
    cfg.candidates_weight_feature_name = "item_action_weight"
    cfg.candidates_watchtime_feature_name = "item_dummy_watchtime"
    cfg.action_weights = [1, 2, 4]
    cfg.contextual_feature_to_max_length = {n: 1 for n in CONTEXTUAL_FEATURES}
    cfg.contextual_feature_to_min_uih_length = {n: 0 for n in CONTEXTUAL_FEATURES}
    cfg.merge_uih_candidate_feature_mapping = list(UIH_TO_CANDIDATE)
    cfg.multitask_configs = [TaskConfig(task_name="listen_plus", task_weight=1,
                                        task_type=MultitaskTaskType.BINARY_CLASSIFICATION)]
    return cfg


def reference_model() -> DlrmHSTU:
    rows, dim = table_rows(), golden_config().model.embedding_dim
    tables = {n: EmbeddingConfig(num_embeddings=rows[n], embedding_dim=dim, name=n,
                                 feature_names=list(f)) for n, (_r, f) in TABLES.items()}
    model = DlrmHSTU(reference_config(), tables, is_inference=False, bf16_training=False)
    model._embedding_collection = EmbeddingCollection(tables=list(tables.values()),
                                                      need_indices=False, device=torch.device("cpu"))
    model.set_hammer_kernel(HammerKernel.PYTORCH)
    theirs = dict(model.named_parameters())
    names = golden_parameter_names()
    assert sorted(reference_name(n) for n in names) == sorted(theirs), "parameter sets differ"
    with torch.no_grad():
        for n in names:
            theirs[reference_name(n)].copy_(golden_weight(n, theirs[reference_name(n)].shape))
    return model.train()


def main(out: Path) -> None:
    torch.manual_seed(0)
    model = reference_model()
    logits_seen: list[torch.Tensor] = []
    model._multitask_module._prediction_module.register_forward_hook(
        lambda _m, _i, out: logits_seen.append(out.detach().clone()))
    by_reference = {reference_name(n): n for n in golden_parameter_names()}
    record: dict[str, np.ndarray] = {}
    for name, batch in golden_batches().items():
        model.zero_grad(set_to_none=True)
        logits_seen.clear()
        _, _, aux_losses, _, _, _ = model(batch.uih, batch.candidates, batch.sparse)
        loss = sum(aux_losses.values())
        loss.backward()
        record.update(golden_record(f"{name}/loss", loss.detach()))
        record.update(golden_record(f"{name}/logits", logits_seen[0].squeeze(-1)))
        for ref_name, p in model.named_parameters():
            record.update(golden_record(f"{name}/grad/{by_reference[ref_name]}", p.grad))
        print(f"{name}: loss {loss.item():.9g}, logits {record[f'{name}/logits']}")
    np.savez_compressed(out, **record)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=GOLDEN_FILE,
                        help="where to write the figures (default: the committed file)")
    main(parser.parse_args().out)
