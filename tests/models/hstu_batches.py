"""Tiny hand-made DLRMv4 batches (SequenceBatch) for the model tests."""

from __future__ import annotations

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.config import load_config
from dlrmtrain.config.schema import Config
from dlrmtrain.sequence_features import (
    CANDIDATE_FEATURES, CONTEXTUAL_FEATURES, UIH_FEATURES, SequenceBatch)

TINY_HSTU = [
    "model.arch=dlrmv4_hstu", "model.embedding_dim=8", "model.max_table_rows=50",
    "model.hstu.max_seq_len=32", "model.hstu.dim=12", "model.hstu.num_layers=2",
    "model.hstu.num_heads=2", "model.hstu.attn_qk_dim=4", "model.hstu.attn_linear_dim=3",
    "model.hstu.preprocessor_hidden_dim=10", "model.hstu.item_mlp_hidden_dim=9",
    "model.hstu.head_hidden_dim=7", "model.hstu.num_position_buckets=20",
    "model.hstu.num_time_buckets=16",
]


def tiny_hstu_config(*overrides: str) -> Config:
    return load_config(None, [*TINY_HSTU, *overrides])


def _kjt(keys: list[str], per_key: dict[str, list[list[int]]]) -> KeyedJaggedTensor:
    lengths = [len(v) for k in keys for v in per_key[k]]
    values = [x for k in keys for v in per_key[k] for x in v]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64))


def make_batch(histories: list[list[tuple[int, int, int, int, int]]],
               candidates: list[tuple[int, int, int, int, int]],
               users: list[int], rows: int = 50) -> SequenceBatch:
    """histories[b]: (item, artist, album, action bits, timestamp) per event, oldest first;
    candidates[b]: the same for the candidate (its bits hold the label); users[b]: uid.
    Cross features are simple functions of uid/item so every table is exercised."""
    uih: dict[str, list[list[int]]] = {k: [] for k in UIH_FEATURES}
    cand: dict[str, list[list[int]]] = {k: [] for k in CANDIDATE_FEATURES}
    for b, (hist, c, uid) in enumerate(zip(histories, candidates, users)):
        uih["uid"].append([uid % rows])
        for i, name in enumerate(CONTEXTUAL_FEATURES[1:]):
            uih[name].append([(uid * 7 + i * 3 + (hist[-1][0] if hist else 0)) % rows])
        for j, name in enumerate(["item_id", "artist_id", "album_id", "action_weight",
                                  "action_timestamp"]):
            uih[name].append([e[j] for e in hist])
        uih["dummy_watch_time"].append([0 for _ in hist])
        for j, name in enumerate(["item_candidate_id", "item_candidate_artist_id",
                                  "item_candidate_album_id", "item_action_weight",
                                  "item_query_time"]):
            cand[name].append([c[(0, 1, 2, 3, 4)[j]]])
        cand["item_dummy_watchtime"].append([0])
    return SequenceBatch.of(_kjt(UIH_FEATURES, uih), _kjt(CANDIDATE_FEATURES, cand))


def random_batch(gen: torch.Generator, batch_size: int, max_history: int, rows: int = 50,
                 min_history: int = 0, time_origin: int = 1_000_000,
                 max_gap_s: int = 5000) -> SequenceBatch:
    """Random lengths, ids and times; the label is learnable: listen_plus when the
    candidate's item is even."""
    histories, candidates, users = [], [], []
    for _ in range(batch_size):
        n = int(torch.randint(min_history, max_history + 1, (1,), generator=gen))
        t = time_origin + int(torch.randint(0, max(time_origin, 1), (1,), generator=gen))
        hist = []
        for _ in range(n):
            item = int(torch.randint(0, rows, (1,), generator=gen))
            t += int(torch.randint(1, max_gap_s, (1,), generator=gen))
            hist.append((item, item % 7, item % 11, int(torch.randint(0, 8, (1,), generator=gen)), t))
        item = int(torch.randint(0, rows, (1,), generator=gen))
        candidates.append((item, item % 7, item % 11, 1 if item % 2 == 0 else 4, t + 100))
        histories.append(hist)
        users.append(int(torch.randint(0, rows, (1,), generator=gen)))
    return make_batch(histories, candidates, users, rows)
