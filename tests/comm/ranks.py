"""Rank programs for the codec tests: stock sharder vs ours on real Gloo ranks.

Each rank builds the same small EmbeddingBagCollection (meta device) with a
linear layer on top, shards it twice with DistributedModelParallel — once with
TorchRec's stock sharder (`none`), once with `CodecEmbeddingBagCollectionSharder.for_codecs("dedup", ...)` —
copies identical weights into both, feeds both the same batches and returns
what the tests compare. Batches are a pure function of (scenario, step, rank),
so every rank can recompute every other rank's ids for independent byte counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn as nn
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrmtrain.comm.embeddingbag import CodecEmbeddingBagCollectionSharder
from dlrmtrain.comm.stats import CommCounters, collect_comm_stats
from dlrmtrain.run.console import comm_summary
from dlrmtrain.comm.stock_bytes import count_stock_dists
from dlrmtrain.comm.topology import FLAT, Hierarchy
from dlrmtrain.comm.torchrec.contexts import CODEC_ATTRIBUTES
from dlrmtrain.comm.torchrec.kernels import emit_rows_in
from dlrmtrain.precision import autocast, embedding_output_dtype
from tests.comm.stream_check import STREAM, observed_records, reachable_tensors, unrecorded


@dataclass(frozen=True)
class Table:
    name: str
    rows: int
    dim: int
    placement: tuple  # ("tw", rank), ("cw", (rank, rank, ...)) or ("rw",): rows over all ranks
    ids: str = "random"  # random | equal | distinct | empty_on_rank1 | missing | jagged
    bag: int = 1  # fixed multi-hot bag size (bag = lookup[id], as the DCNv2 reference)


# The mix most two-rank codec tests start from: a table-wise table on each rank (b's bags
# partly empty: ids="missing"), a column-wise one split over both; tests add their own tables.
TWO_RANK_MIX = (
    Table("a", 10, 8, ("tw", 0)),
    Table("b", 12, 8, ("tw", 1), ids="missing"),
    Table("c", 10, 16, ("cw", (0, 1))),
)


@dataclass(frozen=True)
class Scenario:
    tables: tuple[Table, ...]
    batch: int = 8
    steps: int = 1
    optimizer: str = "sgd"  # sgd | adagrad
    lr: float = 0.1
    id_range: int = 6  # random ids drawn from [0, id_range): many duplicates
    table_codecs: dict = field(default_factory=dict)  # per-table overrides under dedup
    precision: str = "fp32"  # precision.mode: bf16 rows on the wire, the dense part under autocast


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def bags_for(sc: Scenario, step: int, rank: int) -> dict[str, list[list[int]]]:
    """Each feature's bags (id lists) for this (step, rank): the test's ground truth."""
    out: dict[str, list[list[int]]] = {}
    for ti, t in enumerate(sc.tables):
        g = _gen(1000 * step + 17 * rank + ti)
        B = sc.batch
        if t.ids == "equal":
            one = [[3]] * B
        elif t.ids == "distinct":
            start = (rank * B) % max(t.rows - B, 1)
            one = [[start + b] for b in range(B)]
        elif t.ids == "empty_on_rank1" and rank == 1:
            one = [[] for _ in range(B)]
        elif t.ids == "missing":
            ids = torch.randint(0, sc.id_range, (B,), generator=g).tolist()
            keep = torch.rand(B, generator=g) < 0.6
            one = [[i] if k else [] for i, k in zip(ids, keep.tolist())]
        elif t.ids == "jagged":
            lens = torch.randint(0, 4, (B,), generator=g).tolist()
            one = [torch.randint(0, 3, (n,), generator=g).tolist() for n in lens]
        else:
            one = [[i] for i in torch.randint(0, sc.id_range, (B,), generator=g).tolist()]
        if t.bag > 1:  # fixed-size multi-hot: the bag is a fixed function of the one-hot id
            lookup = torch.randint(0, t.rows, (t.rows, t.bag), generator=_gen(99 + ti))
            one = [lookup[b[0]].tolist() if b else [] for b in one]
        out[f"f_{t.name}"] = one
    return out


def batch_for(sc: Scenario, step: int, rank: int) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    bags = bags_for(sc, step, rank)
    keys = list(bags)
    lengths = [len(b) for k in keys for b in bags[k]]
    values = [i for k in keys for b in bags[k] for i in b]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64))
    labels = (torch.rand(sc.batch, generator=_gen(7 + 1000 * step + rank)) < 0.5).float()
    return kjt, labels


class TinyModel(nn.Module):
    def __init__(self, sc: Scenario) -> None:
        super().__init__()
        self.features = [f"f_{t.name}" for t in sc.tables]
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                       feature_names=[f"f_{t.name}"]) for t in sc.tables],
            device=torch.device("meta"))
        torch.manual_seed(0)
        self.dense = nn.Linear(sum(t.dim for t in sc.tables), 1)

    def forward(self, kjt: KeyedJaggedTensor, labels: torch.Tensor):
        kt = self.ebc(kjt)
        self.last_keys = kt.keys()  # the order the rows arrive in (tests/comm/test_dedup_source_ranks.py)
        pooled = kt.to_dict()
        x = torch.cat([pooled[f] for f in self.features], dim=1)
        loss = nn.functional.binary_cross_entropy_with_logits(self.dense(x).squeeze(1), labels)
        return loss, x.detach()


def _sharded_ebc(model: nn.Module) -> ShardedEmbeddingBagCollection:
    return next(m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection))


def _placement(t: Table):
    kind = t.placement[0]
    if kind == "tw":
        return table_wise(rank=t.placement[1], compute_kernel="fused")
    if kind == "cw":
        return column_wise(ranks=list(t.placement[1]), compute_kernel="fused")
    return row_wise(compute_kernel="fused")


def build(sc: Scenario, codec: str, world_size: int, hierarchy: Hierarchy = FLAT, source: bool = False):
    """The sharded TinyModel, its dense optimizer and its counters (the codec dists); `source`: the
    `comm.dedup_at: source` sharder."""
    opt = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ADAGRAD}[sc.optimizer]
    fused = {"optimizer": opt, "learning_rate": sc.lr,
             "output_dtype": embedding_output_dtype(sc.precision, "cpu")}
    if sc.optimizer == "adagrad":
        fused["eps"] = 1e-8
    counters = CommCounters()
    if source:
        from dlrmtrain.comm.dedup.source import SourceDedupEBCSharder
        sharder = SourceDedupEBCSharder(fused_params=fused)
    else:
        sharder = CodecEmbeddingBagCollectionSharder.for_codecs(
            codec, sc.table_codecs if codec != "none" else {}, fused,
            hierarchy=hierarchy if codec != "none" else FLAT, counters=counters)
    model = TinyModel(sc)
    per_param = {t.name: _placement(t) for t in sc.tables}
    mplan = construct_module_sharding_plan(model.ebc, per_param, sharder=sharder, local_size=world_size,
                                           world_size=world_size, device_type="cpu")
    dmp = DistributedModelParallel(model, plan=ShardingPlan({"ebc": mplan}), sharders=[sharder],
                                   device=torch.device("cpu"))
    emit_rows_in(dmp, fused["output_dtype"])  # as distributed/sharding.py's DMP: bf16 rows on CPU under bf16
    # identical initial tables in both models: copy each local shard's slice
    for t_i, t in enumerate(sc.tables):
        full = torch.rand(t.rows, t.dim, generator=_gen(500 + t_i)) - 0.5
        shards = dmp.state_dict()[f"ebc.embedding_bags.{t.name}.weight"].local_shards()
        for shard in shards:
            r0, c0 = shard.metadata.shard_offsets
            nr, nc = shard.metadata.shard_sizes
            shard.tensor.detach().copy_(full[r0:r0 + nr, c0:c0 + nc])
    dense_opt_cls = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad}[sc.optimizer]
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda p: dense_opt_cls(p, lr=sc.lr))
    return dmp, dense_opt, counters


def local_weights(dmp: nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            for i, shard in enumerate(value.local_shards()):
                out[f"{key}#{i}"] = shard.tensor.detach().clone()
    return out


def table_row_grads(features: KeyedJaggedTensor, embs_grad: torch.Tensor, dims: list[int]) -> list[torch.Tensor]:
    """Per table-row gradient the embedding backward forms from pooled-output grads."""
    out, col = [], 0
    for i, key in enumerate(features.keys()):
        jt = features[key]
        d = dims[i]
        g = embs_grad[:, col:col + d]
        col += d
        bag_of_value = torch.repeat_interleave(torch.arange(jt.lengths().numel()), jt.lengths())
        rows = int(jt.values().max()) + 1 if jt.values().numel() else 1
        acc = torch.zeros(max(rows, 1), d, dtype=torch.float64)
        acc.index_add_(0, jt.values(), g[bag_of_value].double())
        out.append(acc)
    return out


def run_codec(sc: Scenario, codec: str, rank: int, world_size: int, count_stock: bool = False,
              hierarchy: Hierarchy = FLAT) -> dict:
    """Train sc.steps steps under `codec`; `count_stock` attaches none's byte counters to stock dists."""
    dmp, dense_opt, counters = build(sc, codec, world_size, hierarchy)
    sebc = _sharded_ebc(dmp)
    if count_stock:
        count_stock_dists(dmp, counters)
    captured: list = []
    dims_per_sharding = [list(s._emb_dim_per_rank_per_feature()[rank]) if hasattr(s, "_emb_dim_per_rank_per_feature")
                         else list(s.embedding_dims())  # row-wise: every feature, full width, on every rank
                         for s in sebc._embedding_shardings]

    def on_lookup(features, embs, module, _):
        idx = sum(1 for c in captured if c[0] == "lookup")
        if embs.requires_grad and embs.numel():
            embs.register_hook(lambda g, f=features, i=idx: captured.append(
                ("grad", i, table_row_grads(f, g, dims_per_sharding[i]))))
        captured.append(("lookup", idx))

    # TorchRec's other entry: compute() and output_dist() called separately
    kjt0, _ = batch_for(sc, 0, rank)
    with torch.no_grad():
        ctx = sebc.create_context()
        dist_input = sebc.input_dist(ctx, kjt0).wait().wait()
        split = sebc.output_dist(ctx, sebc.compute(ctx, dist_input)).wait().to_dict()
    split_path_pooled = torch.cat([split[f] for f in dmp.module.features], dim=1)
    for d in counters:  # training steps only
        d.comm_stats = dataclasses.replace(d.comm_stats, tables={}, steps=0, codec_seconds=0.0, fallback_steps=0,
                                           transfer_seconds=0.0, messages=0, inter_node_messages=0,
                                           inter_node_bytes=0, intra_node_bytes=0, id_exchange_bytes=0)

    sebc.post_lookup_tracker_fn = on_lookup
    result = {"losses": [], "pooled": [], "emb_grads": [], "dense_grads": [], "weights_after_1": None}
    for step in range(sc.steps):
        kjt, labels = batch_for(sc, step, rank)
        captured.clear()
        dense_opt.zero_grad()
        with autocast(sc.precision, torch.device("cpu")):
            loss, pooled = dmp(kjt, labels)
        loss.backward()
        if step == 0:
            result["pooled"] = pooled
            result["pooled_dtype"] = str(pooled.dtype)
            result["emb_grads"] = [c[2] for c in captured if c[0] == "grad"]
            result["dense_grads"] = {n: p.grad.clone() for n, p in dmp.named_parameters()
                                     if p.grad is not None}
        dense_opt.step()
        if step == 0:
            result["weights_after_1"] = local_weights(dmp)
        result["losses"].append(loss.item())
    result["split_path_pooled"] = split_path_pooled
    result["stats"] = collect_comm_stats(counters)
    result["stats_all_ranks"] = collect_comm_stats(counters, all_ranks=True)
    result["summary"] = comm_summary(result["stats"])
    del dmp, dense_opt, sebc
    return result


def count_host_syncs(rank: int, world_size: int, sc: Scenario, codec: str, hierarchy: Hierarchy = FLAT) -> dict:
    """Train sc.steps steps under HostSyncCounter; the codec's syncs per step and its dists' types."""
    from tests.comm.sync_counter import HostSyncCounter

    dmp, dense_opt, counters = build(sc, codec, world_size, hierarchy)
    sebc = _sharded_ebc(dmp)
    per_step = []
    for step in range(sc.steps):
        kjt, labels = batch_for(sc, step, rank)
        counter = HostSyncCounter()
        with counter:
            dense_opt.zero_grad()
            loss, _ = dmp(kjt, labels)
            loss.backward()
            dense_opt.step()
        per_step.append(counter.syncs)
    counted = collect_comm_stats(counters)["host_syncs_per_step"]  # what the comm stats say
    # the dist itself hands back an awaitable with the transfer in flight
    with torch.no_grad():
        ctx = sebc.create_context()
        dist_input = sebc.input_dist(ctx, batch_for(sc, 0, rank)[0]).wait().wait()
        embs = sebc.compute(ctx, dist_input)
        awaitables = [d(e, c) for d, e, c in zip(sebc._output_dists, embs, ctx.sharding_contexts)]
        kinds = [type(a).__name__ for a in awaitables]
        works = [type(a._req.work).__name__ for a in awaitables if hasattr(a, "_req")]
        # stream safety (the plans before their waits: two-level's deferred stage 2 still in its closure)
        plans_unrecorded = [unrecorded(a._req.plan) for a in awaitables if hasattr(a, "_req")]
        ctx_unrecorded = unrecorded(ctx, [[getattr(c, name, None) for name in CODEC_ATTRIBUTES]
                                          for c in ctx.sharding_contexts])
        held = [reachable_tensors(a._req) for a in awaitables if hasattr(a, "_req")]  # buffers, plan
        with observed_records() as calls:
            outs = [a._wait_impl() for a in awaitables]  # what the wait returns, before any callback
        recorded = {id(t) for t, s in calls if s is STREAM}
        awaited_recorded = [id(out) in recorded for out in outs]
        request_unrecorded = [(len(ts), sum(id(t) not in recorded for t in ts)) for ts in held]
        del held
    result = {"per_step": per_step, "awaitables": kinds, "works": works, "counted_per_step": counted,
              "plans_unrecorded": plans_unrecorded, "ctx_unrecorded": ctx_unrecorded,
              "awaited_recorded": awaited_recorded, "request_unrecorded": request_unrecorded,
              "dists": len(counters)}  # codec dists only: no stock counters attached here
    del dmp, dense_opt, sebc
    return result


def compare(rank: int, world_size: int, sc: Scenario) -> dict:
    """Run `none` then `dedup` on this rank; return both results for the test to compare."""
    return compare_codecs(rank, world_size, sc, ("none", "dedup"))


def compare_codecs(rank: int, world_size: int, sc: Scenario, codecs: tuple[str, ...]) -> dict:
    """Run each codec on this rank (same weights, same batches); results keyed by codec."""
    return to_numpy({codec: run_codec(sc, codec, rank, world_size) for codec in codecs})


def compare_counted(rank: int, world_size: int, sc: Scenario, codecs: tuple[str, ...]) -> dict:
    """`compare_codecs` with none's byte counters attached wherever the stock dist runs."""
    return to_numpy({codec: run_codec(sc, codec, rank, world_size, count_stock=True) for codec in codecs})


def to_numpy(obj):
    """Tensors become numpy arrays (plain, compact pickles for the parent process)."""
    if isinstance(obj, torch.Tensor):  # bf16 widened to fp32 (exact): numpy has no bf16
        return (obj.float() if obj.dtype == torch.bfloat16 else obj).detach().numpy()
    if isinstance(obj, dict):
        return {k: to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_numpy(v) for v in obj)
    return obj
