"""Rank programs for the sequence-embedding (EmbeddingCollection) tests, on real Gloo ranks.

Every rank builds the same small EmbeddingCollection from DLRMv4's table layout
(`sequence_features.TABLES`: item_id serves item_id and item_candidate_id, ...)
with a tiny dim and a row cap, the same initial weights, and batches that are a
pure function of (step, rank) with heavy repetition, so the tests recompute
every rank's ids for a single-process reference and independent byte counts.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor

from dlrmtrain.comm.stock_bytes import SequenceStockCounter
from dlrmtrain.comm.stats import collect_comm_stats
from dlrmtrain.config.schema import AutoConfig, CommConfig, ShardingConfig
from dlrmtrain.distributed.sharding import rowwise_adagrad_fused_params, shard_sequence_model
from dlrmtrain.precision import embedding_output_dtype
from dlrmtrain.sequence_features import CANDIDATE_FEATURES, CONTEXTUAL_FEATURES, TABLES

DIM = 8
ROW_CAP = 41  # odd: row-wise blocks of unequal size (21 + 20 rows on 2 ranks)
LR, EPS = 0.05, 1e-8
SEQUENCE_FEATURES = ["item_id", "artist_id", "album_id"]
"""one id per history position"""
ONE_PER_SAMPLE = {*CONTEXTUAL_FEATURES, *CANDIDATE_FEATURES}


@dataclass(frozen=True)
class SeqScenario:
    sharding_tables: dict = field(default_factory=dict)   # table -> sharding type
    default_type: str = "row_wise"
    batch: int = 3
    max_len: int = 6
    pool: int = 4          # distinct ids per table per batch: heavy repetition
    steps: int = 3
    uneven: bool = False   # rank r's batch is batch + 2r (TorchRec's variable batch per rank)
    planner: str = "manual"  # sharding.planner: manual | torchrec
    precision: str = "fp32"  # the rows' dtype (fused output_dtype): bf16 on the wire under bf16

    def batch_of(self, rank: int) -> int:
        return self.batch + (2 * rank if self.uneven else 0)


def table_rows() -> dict[str, int]:
    return {t: min(rows, ROW_CAP) for t, (rows, _features) in TABLES.items()}


def feature_table() -> dict[str, str]:
    return {f: t for t, (_rows, features) in TABLES.items() for f in features}


def features() -> list[str]:
    return [f for _rows, fs in TABLES.values() for f in fs]


def make_ec() -> EmbeddingCollection:
    """The EC with deterministic weights (the same on every rank and in the reference)."""
    rows = table_rows()
    ec = EmbeddingCollection(tables=[EmbeddingConfig(name=t, embedding_dim=DIM, num_embeddings=rows[t],
                                                     feature_names=list(fs)) for t, (_r, fs) in TABLES.items()],
                             device=torch.device("cpu"))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for t in TABLES:
            ec.embeddings[t].weight.copy_(torch.rand(rows[t], DIM, generator=g) - 0.5)
    return ec


def sequences_for(sc: SeqScenario, step: int, rank: int) -> dict[str, list[list[int]]]:
    """Per feature, per sample: its ids. Ids repeat heavily and span every row block."""
    g = torch.Generator().manual_seed(1000 * step + 17 * rank)
    rows = table_rows()
    pools = {t: torch.randperm(rows[t], generator=g)[:sc.pool].tolist() for t in TABLES}
    table_of = feature_table()
    out: dict[str, list[list[int]]] = {}
    lengths = torch.randint(0, sc.max_len + 1, (sc.batch_of(rank),), generator=g).tolist()
    lengths[0] = max(lengths[0], 1)
    for f in features():
        pool = pools[table_of[f]]
        out[f] = [[pool[i] for i in torch.randint(0, len(pool), (1 if f in ONE_PER_SAMPLE else n,),
                                                   generator=g).tolist()]
                  for n in lengths]
    return out


def kjt_of(seqs: dict[str, list[list[int]]]) -> KeyedJaggedTensor:
    keys = list(seqs)
    values = [i for k in keys for s in seqs[k] for i in s]
    lengths = [len(s) for k in keys for s in seqs[k]]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.tensor(values, dtype=torch.int64),
                                               lengths=torch.tensor(lengths, dtype=torch.int64))


def probe_vectors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {f: torch.randn(DIM, generator=g) for f in features()}


def loss_of(out: dict, batch: int, probes: dict[str, torch.Tensor]) -> torch.Tensor:
    """A nonlinear per-position loss (gradients depend on the embeddings), mean over samples."""
    return sum(torch.tanh(out[f].values().float() @ probes[f]).sum() for f in features()) / batch


class SeqModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ec = make_ec()

    def forward(self, kjt: KeyedJaggedTensor):
        return self.ec(kjt)


def read_tables(dmp: nn.Module) -> dict[str, np.ndarray]:
    """Every table's full weights, read through the sharded forward (rank 0's sample holds all ids)."""
    rows, table_of = table_rows(), feature_table()
    first_feature = {}
    for f in features():
        first_feature.setdefault(table_of[f], f)
    rank = dist.get_rank()
    seqs = {f: [list(range(rows[table_of[f]])) if rank == 0 and first_feature[table_of[f]] == f else []]
            for f in features()}
    with torch.no_grad():
        out = dmp(kjt_of(seqs))
        out = out.wait() if hasattr(out, "wait") else out
    return {t: out[f].values().float().numpy().copy() for t, f in first_feature.items()} if rank == 0 else {}


def shard(sc: SeqScenario, codec: str, world_size: int, table_codecs: dict | None = None,
          dedup_at: str = "owner", auto: AutoConfig | None = None):
    sharding = ShardingConfig(planner=sc.planner, default_type=sc.default_type, tables=dict(sc.sharding_tables))
    comm = CommConfig(codec=codec, table_codecs=dict(table_codecs or {}), dedup_at=dedup_at,
                      auto=auto or AutoConfig())
    from dlrmtrain.comm.placement import Placement

    return shard_sequence_model(SeqModel(), "ec", sharding, Placement(comm, "sequence"),
                                rowwise_adagrad_fused_params(LR, EPS, embedding_output_dtype(sc.precision, "cpu")),
                                torch.device("cpu"), world_size)


def source_made(dmp: nn.Module):
    """sequences → the KJT the loader makes under comm.dedup_at: source (each table's distinct ids)."""
    from dlrmtrain.comm.dedup.sequence_source import sequence_source_transform

    transform = sequence_source_transform(dmp)
    return lambda seqs: transform(kjt_of(seqs))


def train(sc: SeqScenario, codec: str, rank: int, world_size: int, dedup_at: str = "owner") -> dict:
    """sc.steps fused-RowWiseAdagrad steps; outputs per step, losses, tables after, comm stats."""
    dmp, plan_text, counters = shard(sc, codec, world_size, dedup_at=dedup_at)
    made = source_made(dmp) if dedup_at == "source" else kjt_of
    probes = probe_vectors()
    result: dict = {"outputs": [], "losses": [], "plan": plan_text}
    for step in range(sc.steps):
        out = dmp(made(sequences_for(sc, step, rank)))
        out = out.wait() if hasattr(out, "wait") else out
        result["outputs"].append({f: out[f].values().detach().float().numpy().copy() for f in features()})
        result.setdefault("dtype", str(out[features()[0]].values().dtype))
        loss = loss_of(out, sc.batch_of(rank), probes)
        loss.backward()  # the fused optimizer updates the tables here
        result["losses"].append(loss.item())
    result["stats"] = collect_comm_stats(counters)
    result["tables"] = read_tables(dmp)
    result["codec_dists"] = sum(not isinstance(c, SequenceStockCounter) for c in counters)
    # one more step, counting the codec's host syncs (what would stall a GPU)
    from tests.comm.sync_counter import HostSyncCounter

    counter = HostSyncCounter()
    batch = made(sequences_for(sc, sc.steps, rank))  # where the loader makes it: off the step
    with counter:
        out = dmp(batch)
        out = out.wait() if hasattr(out, "wait") else out
        loss_of(out, sc.batch_of(rank), probes).backward()
    result["syncs"] = counter.syncs
    dist.barrier()
    del dmp
    gc.collect()
    return result


def reference(sc: SeqScenario, world_size: int) -> dict:
    """The single-process run: one plain EC sees every rank's batch; RowWiseAdagrad by hand.

    Each rank's loss is divided by the world size, as TorchRec's all-to-all
    backward divides the gradients of the sharded tables. A column-wise table
    is cut into one column shard per rank, each with its own row accumulator
    (TorchRec's RowWiseAdagrad state is per shard: the mean of g² over the
    shard's columns).
    """
    ec = make_ec()
    probes = probe_vectors()
    shards = {t: world_size if sc.sharding_tables.get(t, sc.default_type) == "column_wise" else 1
              for t in TABLES}
    state = {t: torch.zeros(ec.embeddings[t].weight.shape[0], shards[t]) for t in TABLES}
    outputs: list[list[dict]] = []
    for step in range(sc.steps):
        ec.zero_grad()
        per_rank, total = [], 0.0
        for rank in range(world_size):
            out = ec(kjt_of(sequences_for(sc, step, rank)))
            per_rank.append({f: out[f].values().detach().numpy().copy() for f in features()})
            total = total + loss_of(out, sc.batch_of(rank), probes) / world_size
        total.backward()
        with torch.no_grad():
            for t in TABLES:
                w = ec.embeddings[t].weight
                g = w.grad.view(w.shape[0], shards[t], -1)
                state[t] += (g * g).mean(dim=2)
                w -= ((LR / (state[t].sqrt() + EPS)).unsqueeze(2) * g).view(w.shape)
        outputs.append(per_rank)
    return {"outputs": outputs, "tables": {t: ec.embeddings[t].weight.detach().numpy().copy() for t in TABLES}}
