"""A step-time cost model for codecs `none`, `dedup`, two-level `dedup` and `auto`: validated
against the shaped-link and simulated-node sweeps on this machine, then used to project
8 / 64 / 512 GPUs.

    python scripts/project_cluster.py --sweep /tmp/bench_link/sweep.json \\
        --kernels-ms UNIQUE EXPAND SEGSUM [--loopback-gbit 17] [--out docs/]
    python scripts/project_cluster.py --node-sweep /tmp/sim_2x2 --node-sweep /tmp/sim_2x4 \\
        [--criteo PATH/criteo_kaggle_sample.tsv.gz]

The model (every term per rank and per training step):

    T(codec) = T_compute + T_codec + (1 - overlap) * bytes(codec) / bandwidth

- T_compute: everything but the embedding all-to-all and the codec (MLPs,
  lookups, optimizer, input dist). On this machine: `none`'s unshaped step minus
  its bytes over the loopback rate; on a GPU: local batch / an assumed per-GPU rate.
- bytes(codec): pooled rows forward + gradients backward that leave the rank,
  from the calibrated id distributions (bench_comm.py's counting, or the
  profile's expected distinct fraction per table at the block size).
- T_codec (dedup only): unique + expand + segment-sum, from bench_codec_kernels.py
  rates (here: its CPU figures; on a GPU: memory-bound at an assumed bandwidth).
- overlap: the share of the transfer hidden behind compute; 0 for the plain loop
  this machine measures (the pooled all-to-all sits between lookup and MLP).

On the shaped loopback every byte of both ranks in both directions crosses one
link, so there `bandwidth` is the link rate and `bytes` the sum over ranks,
including the dense gradient all-reduce and the id all-to-all (both codecs alike);
and every byte still costs the loopback's kernel copies (CPU, `--loopback-gbit`)
on top of the shaped rate. Three variants of T_codec are checked: from the
kernel bench's rates, fitted to the unshaped run, and counted by the dedup
contender itself in the unshaped run (bench_train's `codec_ms_per_step`).

Two levels (`comm.hierarchy: node`, L ranks per node, N nodes): only the
distinct rows of each (table, destination node) cross between nodes, over
the rails (each rank talks to its peer of every other node: N - 1 messages per
hop, not W - 1); inside the node the forwarder hands each rank the rows its
bags use. Per GPU and step, forward + backward, with U_t(b) the expected
distinct rows of table t in b draws of the profile:

    between nodes  2 * D * 4 * (N - 1) / W * sum_t U_t(L * B)
    inside a node  2 * D * 4 * (L - 1) / L * sum_t U_t(B)   (+ the node's id exchange)

against one-level dedup's 2 * D * 4 * (W - L) / W * sum_t U_t(B) between nodes:
the saving between nodes is the node-level distinct fraction
U(L * B) / (L * U(B)) (`node_distinct_ratio`; `--criteo` measures it on a
real Criteo day file). The two hops run one after the other (the intra-node
hop waits for the rail hop), where the flat all-to-all drives NVLink and NIC
at once. On simulated nodes (`--node-sweep`, bench_link.py --sim-nodes) each
node has its own full-duplex link, so a step pays the bytes its node sends:

    T(codec, G) = T(codec, unshaped) + bytes_between_nodes(codec) / N / G

with T(codec, unshaped) each contender's step measured on the same nodes with
unshaped links (compute, codec and the unshaped link's own cost) and the
bytes computed from the profile (or, second variant, counted on the links).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from plots import pyplot  # noqa: E402  (scripts/)
from dlrmtrain.features import MLPERF_DCNV2_MULTI_HOT_SIZES, NUM_DENSE  # noqa: E402
from dlrmtrain.data.synthetic.profiles import expected_distinct_fraction, profile_tables  # noqa: E402

DIM = 128
BOTTOM = [512, 256, 128]
TOP = [1024, 1024, 512, 256, 1]
TABLES = 26

# ------------------------------------------------------------------ cluster assumptions
GPUS = (8, 64, 512)
GPUS_PER_NODE = 8
# Per-GPU, per-direction link rates (Gbit/s) for the all-to-all.
FABRICS = {
    # H100 NVLink 4: 450 GB/s per direction per GPU; 64 / 512 GPUs assume one NVLink
    # switch domain spanning them all (an idealisation beyond 256 GPUs).
    "NVLink": {"nvlink": 3600.0, "nic": None},
    # One 400 Gb/s NDR NIC per GPU (rail-optimised); NVLink inside each 8-GPU node.
    "IB 400G": {"nvlink": 3600.0, "nic": 400.0},
    # One 100 Gb/s Ethernet NIC per GPU; NVLink inside each 8-GPU node.
    "Eth 100G": {"nvlink": 3600.0, "nic": 100.0},
}
LINK_EFFICIENCY = 0.7          # achieved all-to-all rate / line rate
# Per-message cost (message setup, synchronisation), microseconds, assumed: a message
# inside a node pays NVLink's, one between nodes its fabric's. `none` and one-level
# dedup send as many messages (W - 1 peers per all-to-all); two levels N - 1 between
# nodes and L - 1 inside, per hop.
PEER_US = {"NVLink": 0.5, "IB 400G": 1.5, "Eth 100G": 4.0}
GLOBAL_BATCH = {"DLRM v1": 55296, "DCNv2": 65536}   # MLPerf reference global batches
# Samples/s one GPU trains with the all-to-all excluded (dense, lookups, optimizer):
# assumed, of the order of published 8-GPU MLPerf results (minutes per ~4e9 samples).
GPU_SAMPLES_PER_S = {"DLRM v1": 4.0e6, "DCNv2": 2.0e6}
HBM_GBYTE_PER_S = 3350 * 0.5   # H100 HBM3 at an assumed 50% for gather/scatter kernels
CODEC_FIXED_MS = 0.2           # launches + the one host sync per dist per step (assumed)
# two levels: a second host sync per dist (the node's id counts) and the intra-node hop's launches
TWO_LEVEL_FIXED_MS = 0.3       # (assumed)
STEP_FIXED_MS = 0.3            # per-step launches, optimizer, input dist: paid at any batch (assumed)
SORT_BYTES_PER_ID = 64         # radix sort of int64 keys + index: ~4 passes x 16 B (assumed)
WIRE_BYTES = 4                 # fp32 rows, as dlrmtrain's lossless default sends
ID_BYTES = 8                   # the node's id exchange sends int64 ids and lengths
CODECS = ("none", "dedup", "two-level")


@dataclass(frozen=True)
class Measured:
    link: str
    gbit: float | None
    none_ms: float
    dedup_ms: float


def dense_params(bottom=BOTTOM, top=TOP, tables=TABLES, dim=DIM) -> int:
    """Parameters of DLRM v1's MLPs (dot interaction: top input = dim + pairs)."""
    n, fan_in = 0, NUM_DENSE
    for w in bottom:
        n += fan_in * w + w
        fan_in = w
    fan_in = dim + (tables + 1) * tables // 2
    for w in top:
        n += fan_in * w + w
        fan_in = w
    return n


# ---------------------------------------------------------------- this machine
def validate(sweep: dict, comm: dict, kernels_ms: tuple[float, float, float],
             loopback_gbit: float, shape: str = "mlperf") -> list[dict]:
    """Predicted vs measured dedup/none step ratio at every swept bandwidth."""
    ranks = comm["world_size"]
    ids = comm["none"]["ids"]
    allreduce = ranks * dense_params() * 4  # ring all-reduce: each rank sends ~its gradient
    shared = ids + allreduce  # both codecs alike
    a2a = {"none": comm["none"]["payload"], "dedup": comm["dedup"]["payload"]}
    unique_ms, expand_ms, segsum_ms = kernels_ms
    # both ends rank every block (owner and sample rank), then expand / segment-sum
    codec_s = (2 * unique_ms + expand_ms + segsum_ms) / 1e3
    # Bytes that really crossed the link (bench_train counts lo inside the namespace),
    # where the sweep has them: median over the shaped points.
    counted = {c: [p["loopback_mb_per_step"][name] * 1e6 for p in sweep[shape]
                   if p.get("loopback_mb_per_step")]
               for c, name in (("none", "dlrmtrain"), ("dedup", "dlrmtrain comm.codec=dedup"))}
    link_bytes = {c: a2a[c] + shared for c in a2a}
    for c, values in counted.items():
        if values:
            link_bytes[c] = sorted(values)[len(values) // 2]
    points = [Measured(p["link"], None if p["link"] == "unshaped" else float(p["link"]),
                       p["ms_per_step"]["dlrmtrain"],
                       p["ms_per_step"]["dlrmtrain comm.codec=dedup"]) for p in sweep[shape]]
    base = next(p for p in points if p.gbit is None)
    lo = loopback_gbit * 1e9 / 8
    compute_s = base.none_ms / 1e3 - link_bytes["none"] / lo
    # Second variant: the codec's cost on the step as the unshaped run shows it
    # (dedup's unshaped step minus none's, plus the loopback time it saved).
    codec_fit_s = (base.dedup_ms - base.none_ms) / 1e3 + (link_bytes["none"] - link_bytes["dedup"]) / lo
    # Third variant: the codec time the dedup contender counted itself in the
    # unshaped run (bench_train's comm stats: plan, kernels, launches; rank 0).
    unshaped = next(p for p in sweep[shape] if p["link"] == "unshaped")
    counted_ms = (unshaped.get("codec_ms_per_step") or {}).get("dlrmtrain comm.codec=dedup")
    codec_counted_s = counted_ms / 1e3 if counted_ms is not None else None

    def transfer(nbytes: float, gbit: float | None) -> float:
        # a shaped link still pays the loopback's kernel copies (CPU) on top of its rate
        return nbytes / lo + (0.0 if gbit is None else nbytes / (gbit * 1e9 / 8))

    rows = []
    for p in points:
        none_s = compute_s + transfer(link_bytes["none"], p.gbit)
        dedup_s = compute_s + codec_s + transfer(link_bytes["dedup"], p.gbit)
        predicted, measured = dedup_s / none_s, p.dedup_ms / p.none_ms
        fitted = (compute_s + codec_fit_s + transfer(link_bytes["dedup"], p.gbit)) / none_s
        from_counted = None if codec_counted_s is None else \
            (compute_s + codec_counted_s + transfer(link_bytes["dedup"], p.gbit)) / none_s
        rows.append({"link": p.link, "measured_none_ms": p.none_ms, "measured_dedup_ms": p.dedup_ms,
                     "predicted_none_ms": 1e3 * none_s, "predicted_dedup_ms": 1e3 * dedup_s,
                     "measured_ratio": measured, "predicted_ratio": predicted,
                     "error": predicted / measured - 1,
                     "fitted_ratio": fitted, "fitted_error": fitted / measured - 1,
                     "counted_ratio": from_counted,
                     "counted_error": None if from_counted is None else from_counted / measured - 1,
                     "codec_ms_counted": counted_ms,
                     "codec_ms_kernels": 1e3 * codec_s, "codec_ms_fitted": 1e3 * codec_fit_s,
                     "link_mb_none": link_bytes["none"] / 1e6, "link_mb_dedup": link_bytes["dedup"] / 1e6,
                     "bytes_source": "counted on lo" if counted["none"] else "computed"})
    return rows


# ---------------------------------------------------------------- the data profile
@lru_cache(maxsize=None)
def _distinct(n: int, s: float, batch: int) -> float:
    return expected_distinct_fraction(n, s, batch) * batch


def distinct_rows(sizes: list[int], exponents: list[float], batch: int) -> list[float]:
    """Expected distinct rows U_t(batch) of each table for `batch` draws of the profile."""
    return [_distinct(n, s, batch) for n, s in zip(sizes, exponents)]


def node_distinct_ratio(sizes: list[int], exponents: list[float], ranks_per_node: int, batch: int) -> float:
    """sum_t U_t(L * B) / (L * sum_t U_t(B)): the rows two levels send between nodes,
    as a share of what one-level dedup sends (1 = no row repeats across the node's ranks)."""
    node = sum(distinct_rows(sizes, exponents, ranks_per_node * batch))
    return node / (ranks_per_node * sum(distinct_rows(sizes, exponents, batch)))


def measured_node_ratio(ids: np.ndarray, ranks_per_node: int, batch: int) -> float:
    """node_distinct_ratio counted on real ids [rows, tables]: consecutive node blocks of
    L * B rows (rank k of the node: its k-th block of B), summed over blocks and tables."""
    L = ranks_per_node
    blocks = len(ids) // (L * batch)
    if blocks == 0:
        raise ValueError(f"{len(ids)} rows are fewer than one node block of {L} x {batch}")
    node = per_rank = 0
    for b in range(blocks):
        block = ids[b * L * batch:(b + 1) * L * batch]
        for t in range(block.shape[1]):
            node += len(np.unique(block[:, t]))
            per_rank += sum(len(np.unique(block[k * batch:(k + 1) * batch, t])) for k in range(L))
    return node / per_rank


def read_criteo_ids(path: Path) -> np.ndarray:
    """The categorical ids [rows, 26] of a raw Criteo day file (.gz ok), in file order."""
    from dlrmtrain.data.formats.criteo_text import iter_parsed
    return np.concatenate([parsed.cats for parsed in iter_parsed(path)])


def default_criteo_sample() -> Path | None:
    """The real Kaggle sample in $DLRMTRAIN_SHARED_DATA, where that is set and holds it."""
    folder = os.environ.get("DLRMTRAIN_SHARED_DATA")
    sample = Path(folder) / "criteo_kaggle_sample.tsv.gz" if folder else None
    return sample if sample and sample.is_file() else None


# Node shapes shown (L ranks x B samples): 2 x 2, 2 x 4 and 8 ranks per node as simulated or
# quoted by issue 18, then the projection's 8-GPU nodes at 64 and 512 GPUs (DLRM v1)
NODE_SHAPES = ((2, 2048), (4, 1024), (8, 1024), (8, 864), (8, 108))


def node_ratio_table(criteo: Path | None) -> list[dict]:
    """U(L·B) / (L·U(B)) at NODE_SHAPES: measured on the real sample (where given), expected
    under the `kaggle` profile (its calibrated twin) and the `terabyte` profile (MLPerf v1 tables)."""
    ids = read_criteo_ids(criteo) if criteo else None
    rows = []
    for L, B in NODE_SHAPES:
        rows.append({"ranks_per_node": L, "batch": B,
                     "criteo": measured_node_ratio(ids, L, B) if ids is not None and len(ids) >= L * B else None,
                     "kaggle": node_distinct_ratio(*profile_tables("kaggle"), L, B),
                     "terabyte": node_distinct_ratio(*profile_tables("terabyte", "v1"), L, B),
                     "terabyte_dcnv2": node_distinct_ratio(*profile_tables("terabyte", "dcnv2"), L, B)})
    return rows


# ---------------------------------------------------------------- a cluster
def model_profile(model: str) -> tuple[list[int], list[float]]:
    return profile_tables("terabyte", "dcnv2" if model == "DCNv2" else "v1")


def a2a_bytes_per_gpu(model: str, gpus: int, codec: str, ranks_per_node: int = GPUS_PER_NODE,
                      profile: tuple[list[int], list[float]] | None = None) -> tuple[float, float]:
    """(intra-node, inter-node) bytes one GPU sends per step, forward + backward.

    Tables spread evenly over the GPUs; `profile` (sizes, exponents) defaults to the
    model's `terabyte` profile. `two-level` on one node is one-level dedup (the codec
    falls back); its intra-node part includes the node's id exchange."""
    local = GLOBAL_BATCH[model] // gpus
    sizes, exponents = profile or model_profile(model)
    tables = len(sizes)
    row = DIM * WIRE_BYTES
    L = min(ranks_per_node, gpus)
    if codec == "two-level" and gpus > L:
        nodes = gpus // L
        inter = 2 * row * (nodes - 1) / gpus * sum(distinct_rows(sizes, exponents, L * local))
        hot = sum(MLPERF_DCNV2_MULTI_HOT_SIZES) if model == "DCNv2" and profile is None else tables
        ids = (tables + hot) * local * ID_BYTES * (L - 1) / L  # lengths + ids to the node's forwarders
        intra = 2 * row * (L - 1) / L * sum(distinct_rows(sizes, exponents, local)) + ids
        return intra, inter
    if codec == "none":
        rows = tables * local
    elif codec in ("dedup", "two-level"):
        rows = sum(distinct_rows(sizes, exponents, local))
    else:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    # a sample's rows come from another GPU with prob (G-1)/G
    total = 2 * rows * row * (gpus - 1) / gpus
    if gpus <= L:
        return total, 0.0
    intra = total * (L - 1) / (gpus - 1)
    return intra, total - intra


def messages_per_gpu(gpus: int, codec: str, ranks_per_node: int = GPUS_PER_NODE) -> tuple[int, int]:
    """(inside a node, between nodes) messages one GPU sends per step for the embeddings,
    forward + backward: W - 1 peers flat; two levels: its rail's N - 1 peers, then its node's
    L - 1 (and the node's id exchange: one all-gather, one all-to-all inside the node)."""
    L = min(ranks_per_node, gpus)
    if codec == "two-level" and gpus > L:
        return 2 * (L - 1) + 2 * (L - 1), 2 * (gpus // L - 1)
    return 2 * (L - 1), 2 * (gpus - L)


def codec_ms_gpu(model: str, gpus: int, codec: str = "dedup", ranks_per_node: int = GPUS_PER_NODE) -> float:
    """The codec's kernels on one GPU: memory-bound expand + segment-sum and the id sorts.
    Two levels add the forwarder's gather and segment-sum, a third sort and a host sync."""
    if codec == "none":
        return 0.0
    local = GLOBAL_BATCH[model] // gpus
    sizes, exponents = model_profile(model)
    L = min(ranks_per_node, gpus)
    two_level = codec == "two-level" and gpus > L
    own = distinct_rows(sizes, exponents, local)
    node = distinct_rows(sizes, exponents, L * local) if two_level else own
    moved = 0.0
    for u, un in zip(own, node):
        moved += 2 * (u + local) * DIM * 4   # expand and segment-sum read + write
        if two_level:  # per GPU: a node's forwarder reads U(L·B) and writes L·U(B), per table
            moved += 2 * (un / L + u) * DIM * 4
    ids = TABLES * local * (sum(MLPERF_DCNV2_MULTI_HOT_SIZES) / TABLES if model == "DCNv2" else 1)
    moved += (3 if two_level else 2) * ids * SORT_BYTES_PER_ID  # owner, (forwarder,) sample side
    fixed = TWO_LEVEL_FIXED_MS if two_level else CODEC_FIXED_MS
    return fixed + 1e3 * moved / (HBM_GBYTE_PER_S * 1e9)


def comm_ms(model: str, gpus: int, fabric: str, codec: str) -> float:
    """The embedding all-to-all's time per step: bytes over NVLink and the NIC, plus messages."""
    links = FABRICS[fabric]
    intra, inter = a2a_bytes_per_gpu(model, gpus, codec)
    m_intra, m_inter = messages_per_gpu(gpus, codec)
    nvlink = links["nvlink"] * 1e9 * LINK_EFFICIENCY / 8
    if links["nic"] is None:  # one NVLink domain: every byte and message on NVLink
        seconds = (intra + inter) / nvlink
        message_us = (m_intra + m_inter) * PEER_US["NVLink"]
    else:
        nv, nic = intra / nvlink, inter / (links["nic"] * 1e9 * LINK_EFFICIENCY / 8)
        two_level = codec == "two-level" and gpus > GPUS_PER_NODE
        # flat: NVLink and NIC carry their parts concurrently; two levels: the intra-node
        # hop waits for the rail hop (forward), the rail hop for the intra-node one (backward)
        seconds = nv + nic if two_level else max(nv, nic)
        message_us = m_intra * PEER_US["NVLink"] + m_inter * PEER_US[fabric]
    return 1e3 * seconds + message_us / 1e3


def project() -> list[dict]:
    rows = []
    for model in GLOBAL_BATCH:
        for fabric in FABRICS:
            for gpus in GPUS:
                local = GLOBAL_BATCH[model] // gpus
                compute_ms = STEP_FIXED_MS + 1e3 * local / GPU_SAMPLES_PER_S[model]
                r = {"model": model, "fabric": fabric, "gpus": gpus, "local_batch": local,
                     "compute_ms": compute_ms,
                     # None on one node: two levels fall back to one
                     "node_ratio": node_distinct_ratio(*model_profile(model), GPUS_PER_NODE, local)
                     if gpus > GPUS_PER_NODE else None}
                for codec in CODECS:
                    key = codec.replace("-", "_")
                    r[f"{key}_comm_ms"] = comm_ms(model, gpus, fabric, codec)
                    r[f"{key}_codec_ms"] = codec_ms_gpu(model, gpus, codec)
                    r[f"{key}_ms"] = compute_ms + r[f"{key}_comm_ms"] + r[f"{key}_codec_ms"]
                    r[f"{key}_inter_mb"] = a2a_bytes_per_gpu(model, gpus, codec)[1] / 1e6
                    r[f"{key}_messages"] = sum(messages_per_gpu(gpus, codec))
                # auto: the best of its paths (the probe's few steps left out)
                best = min(CODECS, key=lambda c: r[f"{c.replace('-', '_')}_ms"])
                r["auto_ms"], r["auto_path"] = r[f"{best.replace('-', '_')}_ms"], best
                r["codec_ms"] = r["dedup_codec_ms"]
                r["speedup"] = r["none_ms"] / r["dedup_ms"]
                r["speedup_two_level"] = r["none_ms"] / r["two_level_ms"]
                r["speedup_auto"] = r["none_ms"] / r["auto_ms"]
                rows.append(r)
    return rows


# ---------------------------------------------------------------- simulated nodes
NODE_CONTENDERS = {"none": "dlrmtrain", "dedup": "dlrmtrain comm.codec=dedup",
                   "two-level": "dlrmtrain comm.codec=dedup comm.hierarchy=node"}


def _override(overrides: list[str], key: str, default):
    for o in overrides:
        k, _, v = o.partition("=")
        if k == key:
            return json.loads(v)
    return default


def sim_bytes_between_nodes(world: int, nodes: int, global_batch: int, dim: int, profile: str,
                            bottom: list[int], top: list[int]) -> dict[str, float]:
    """Bytes per step summed over all nodes' links, per contender: the embedding payload
    (forward + backward) of each codec, plus what every codec sends alike: the ids of
    TorchRec's input all-to-all (int64 id + int32 length) and the dense gradients' ring
    all-reduce (Gloo's ring over ranks in order: N of its W edges cross nodes, each
    carrying 2 (W - 1) / W of the gradient)."""
    L = world // nodes
    B = global_batch // world
    sizes, exponents = profile_tables(profile)
    tables = len(sizes)
    row = dim * WIRE_BYTES
    away = global_batch * (nodes - 1) / nodes  # samples of the other nodes, per table
    payload = {"none": 2 * row * tables * away,
               "dedup": 2 * row * (nodes - 1) * L * sum(distinct_rows(sizes, exponents, B)),
               "two-level": 2 * row * (nodes - 1) * sum(distinct_rows(sizes, exponents, L * B))}
    ids = tables * away * 12
    allreduce = nodes * 2 * (world - 1) / world * dense_params(bottom, top, tables, dim) * 4
    return {c: p + ids + allreduce for c, p in payload.items()}


def load_node_sweep(folder: Path) -> dict:
    """bench_link.py --sim-nodes output: the sweep's points and each run's shape
    (bench_train's JSON of the unshaped point beside sweep.json)."""
    sweep = json.loads((folder / "sweep.json").read_text())
    if len(sweep) != 1:
        raise ValueError(f"{folder / 'sweep.json'}: one shape per node sweep, got {sorted(sweep)}")
    shape, points = next(iter(sweep.items()))
    meta_path = folder / f"{shape}_unshaped.json"
    meta = json.loads(meta_path.read_text())
    if not meta.get("sim_nodes"):
        raise ValueError(f"{meta_path}: not a --sim-nodes run")
    missing = [c for c, name in NODE_CONTENDERS.items() if name not in points[0]["ms_per_step"]]
    if missing:
        raise ValueError(f"{folder / 'sweep.json'}: no contender {missing} "
                         f"(bench_link.py --codecs dedup \"dedup comm.hierarchy=node\")")
    return {"folder": str(folder), "points": points, "world_size": meta["world_size"],
            "nodes": meta["sim_nodes"], "global_batch": meta["global_batch_size"],
            "overrides": meta.get("overrides", [])}


def validate_nodes(run: dict, profile: str = "kaggle", dim: int = DIM) -> list[dict]:
    """Predicted vs measured step times and ratios of none / dedup / two-level on
    simulated nodes at every shaped bandwidth (see the module docstring)."""
    bottom = _override(run["overrides"], "model.bottom_mlp", BOTTOM)
    top = _override(run["overrides"], "model.top_mlp", TOP)
    nodes = run["nodes"]
    computed = sim_bytes_between_nodes(run["world_size"], nodes, run["global_batch"], dim, profile, bottom, top)
    base = next(p for p in run["points"] if p["link"] == "unshaped")
    rows = []
    for p in run["points"]:
        if p["link"] == "unshaped":
            continue
        rate = float(p["link"]) * 1e9 / 8
        counted = {c: (p.get("loopback_mb_per_step") or {}).get(name) for c, name in NODE_CONTENDERS.items()}
        r = {"run": run["folder"], "ranks": f"{nodes}x{run['world_size'] // nodes}", "link": p["link"]}
        for c, name in NODE_CONTENDERS.items():
            r[f"measured_{c}_ms"] = p["ms_per_step"][name]
            r[f"predicted_{c}_ms"] = base["ms_per_step"][name] + 1e3 * computed[c] / nodes / rate
            r[f"counted_{c}_ms"] = None if counted[c] is None else \
                base["ms_per_step"][name] + 1e3 * counted[c] * 1e6 / nodes / rate
            r[f"computed_{c}_mb"] = computed[c] / 1e6
            r[f"counted_{c}_mb"] = counted[c]
        for label, num, den in (("dedup/none", "dedup", "none"), ("two-level/dedup", "two-level", "dedup"),
                                ("two-level/none", "two-level", "none")):
            measured = r[f"measured_{num}_ms"] / r[f"measured_{den}_ms"]
            predicted = r[f"predicted_{num}_ms"] / r[f"predicted_{den}_ms"]
            r[label] = {"measured": measured, "predicted": predicted, "error": predicted / measured - 1}
            if counted[num] is not None and counted[den] is not None:
                from_counted = r[f"counted_{num}_ms"] / r[f"counted_{den}_ms"]
                r[label]["counted"], r[label]["counted_error"] = from_counted, from_counted / measured - 1
        r["worst_time_error"] = max(abs(r[f"predicted_{c}_ms"] / r[f"measured_{c}_ms"] - 1) for c in NODE_CONTENDERS)
        rows.append(r)
    return rows


# ---------------------------------------------------------------- output
def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()

    lines = (("speedup", "dedup (one level)", "o-"), ("speedup_two_level", "two-level dedup", "s-"),
             ("speedup_auto", "auto (best path)", "^:"))
    fig, axes = plt.subplots(len(GLOBAL_BATCH), len(FABRICS), figsize=(12, 6.5), sharey=True, sharex=True)
    for i, model in enumerate(GLOBAL_BATCH):
        for j, fabric in enumerate(FABRICS):
            ax = axes[i][j]
            pts = [r for r in rows if r["model"] == model and r["fabric"] == fabric]
            for key, label, style in lines:
                ax.plot([r["gpus"] for r in pts], [r[key] for r in pts], style, label=label,
                        ms=7 if key == "speedup_auto" else 5)
            ax.axhline(1.0, color="grey", ls="--", lw=1)
            ax.axhline(1.5, color="tab:red", ls=":", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(GPUS), [str(g) for g in GPUS])
            ax.set_title(f"{model}, {fabric}" + (" (one domain)" if FABRICS[fabric]["nic"] is None
                                                 else f", {GPUS_PER_NODE} GPUs/node"), fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(GLOBAL_BATCH) - 1:
                ax.set_xlabel("GPUs")
        axes[i][0].set_ylabel("none / codec step time\n(>1: codec faster)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Projected step-time gain over none (cost model, not measured; dotted red: the issue's 1.5x)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_node_validation(rows: list[dict], path: Path) -> None:
    plt = pyplot()

    runs = list(dict.fromkeys(r["ranks"] for r in rows))
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4.8), squeeze=False)
    for ax, run in zip(axes[0], runs):
        pts = [r for r in rows if r["ranks"] == run]
        xs = range(len(pts))
        for label, color in (("dedup/none", "tab:blue"), ("two-level/dedup", "tab:orange"),
                             ("two-level/none", "tab:green")):
            ax.plot(xs, [r[label]["measured"] for r in pts], "o-", color=color, label=f"{label} measured")
            ax.plot(xs, [r[label]["predicted"] for r in pts], "s--", color=color, label=f"{label} model")
        ax.axhline(1.0, color="grey", lw=1, ls=":")
        ax.set_xticks(list(xs), [r["link"] for r in pts])
        ax.set_xlabel("link between nodes, Gbit/s each way")
        ax.set_ylabel("step-time ratio")
        ax.set_title(f"{run} simulated nodes: model vs measurement", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_validation(rows: list[dict], path: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(rows))
    ax.plot(xs, [r["measured_ratio"] for r in rows], "o-", label="measured (bench_link)")
    ax.plot(xs, [r["predicted_ratio"] for r in rows], "s--", label="model, codec from kernel rates")
    ax.plot(xs, [r["fitted_ratio"] for r in rows], "^:", label="model, codec fitted to the unshaped run")
    if rows[0]["counted_ratio"] is not None:
        ax.plot(xs, [r["counted_ratio"] for r in rows], "v-.", label="model, codec counted in the run")
    ax.fill_between(xs, [0.85 * r["measured_ratio"] for r in rows],
                    [1.15 * r["measured_ratio"] for r in rows], alpha=0.15, label="measured ±15%")
    ax.axhline(1.0, color="grey", lw=1, ls=":")
    ax.set_xticks(list(xs), [r["link"] for r in rows])
    ax.set_xlabel("link Gbit/s (one loopback shared by both ranks)")
    ax.set_ylabel("step time dedup / none")
    ax.set_title("MLPerf shape, 2 CPU ranks: model vs measurement", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_node_validation(rows: list[dict]) -> None:
    print("validation on simulated nodes (each node its own full-duplex link; model: each "
          "contender's unshaped step + its bytes between nodes / nodes / rate):")
    print(f"  {'nodes':>5} {'Gbit/s':>6} {'measured ms none/dedup/2-level':>31} {'model ms':>20} "
          f"{'MB between nodes computed':>26} {'counted':>20}")
    for r in rows:
        ms = "/".join(f"{r[f'measured_{c}_ms']:.0f}" for c in NODE_CONTENDERS)
        pr = "/".join(f"{r[f'predicted_{c}_ms']:.0f}" for c in NODE_CONTENDERS)
        mb = "/".join(f"{r[f'computed_{c}_mb']:.1f}" for c in NODE_CONTENDERS)
        cn = "/".join("-" if r[f"counted_{c}_mb"] is None else f"{r[f'counted_{c}_mb']:.1f}"
                      for c in NODE_CONTENDERS)
        print(f"  {r['ranks']:>5} {r['link']:>6} {ms:>31} {pr:>20} {mb:>26} {cn:>20}")
    print(f"  {'nodes':>5} {'Gbit/s':>6}   ratio: measured  model (error)  model with counted bytes (error)")
    for r in rows:
        for label in ("dedup/none", "two-level/dedup", "two-level/none"):
            x = r[label]
            counted = "" if "counted" not in x else f"  {x['counted']:.3f} ({100 * x['counted_error']:+.1f}%)"
            print(f"  {r['ranks']:>5} {r['link']:>6}   {label:<16} {x['measured']:.3f}  {x['predicted']:.3f} "
                  f"({100 * x['error']:+.1f}%){counted}")
    worst = max(abs(r[k]["error"]) for r in rows for k in ("dedup/none", "two-level/dedup", "two-level/none"))
    worst_ms = max(r["worst_time_error"] for r in rows)
    verdict = lambda e: "within 15%" if e <= 0.15 else "NOT within 15%"  # noqa: E731
    print(f"  worst |error|: step-time ratios {100 * worst:.1f}% ({verdict(worst)}), "
          f"step times {100 * worst_ms:.1f}% ({verdict(worst_ms)})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", type=Path, help="bench_link.py's sweep.json (validation)")
    p.add_argument("--comm", type=Path, help="bench_comm.py --json of the swept shape (2 ranks)")
    p.add_argument("--kernels-ms", nargs=3, type=float, metavar=("UNIQUE", "EXPAND", "SEGSUM"),
                   help="bench_codec_kernels.py's CPU ms at the swept shape")
    p.add_argument("--loopback-gbit", type=float, default=17.0,
                   help="unshaped loopback rate (shaped_link's TCP probe measured ~17)")
    p.add_argument("--node-sweep", type=Path, action="append", default=[],
                   help="bench_link.py --sim-nodes output folder with codecs none, dedup and "
                        "'dedup comm.hierarchy=node' (repeat for 2x2 and 2x4)")
    p.add_argument("--criteo", type=Path, default=default_criteo_sample(),
                   help="raw Criteo day file (.gz ok) to measure the node-level distinct fraction on "
                        "(default: criteo_kaggle_sample.tsv.gz in $DLRMTRAIN_SHARED_DATA)")
    p.add_argument("--out", type=Path, default=Path("/tmp/project_cluster"))
    args = p.parse_args(argv)
    if args.criteo is not None and not args.criteo.is_file():
        p.error(f"--criteo {args.criteo}: no such file")
    for folder in args.node_sweep:
        if not (folder / "sweep.json").is_file():
            p.error(f"--node-sweep {folder}: no sweep.json there (bench_link.py --sim-nodes --out {folder})")
    if args.sweep and not (args.comm and args.kernels_ms):
        p.error("--sweep needs --comm and --kernels-ms")
    return args


def print_validation(args: argparse.Namespace) -> list[dict]:
    """The model against bench_link's sweep on this machine (`--sweep`): the rows, printed and drawn."""
    rows = validate(json.loads(args.sweep.read_text()), json.loads(args.comm.read_text()),
                    tuple(args.kernels_ms), args.loopback_gbit)
    print("validation on this machine (mlperf shape, 2 ranks, one shared loopback link):")
    print(f"  {'link Gbit/s':>11} {'none ms':>9} {'dedup ms':>9} {'pred none':>10} "
          f"{'pred dedup':>11} {'measured':>9} {'predicted':>10} {'error':>7} {'fitted':>7} {'error':>7}"
          f" {'counted':>8} {'error':>7}")
    for r in rows:
        counted = "" if r["counted_ratio"] is None else \
            f" {r['counted_ratio']:8.3f} {100 * r['counted_error']:6.1f}%"
        print(f"  {r['link']:>11} {r['measured_none_ms']:9.0f} {r['measured_dedup_ms']:9.0f} "
              f"{r['predicted_none_ms']:10.0f} {r['predicted_dedup_ms']:11.0f} "
              f"{r['measured_ratio']:9.3f} {r['predicted_ratio']:10.3f} {100 * r['error']:6.1f}% "
              f"{r['fitted_ratio']:7.3f} {100 * r['fitted_error']:6.1f}%{counted}")
    print(f"  link bytes per step ({rows[0]['bytes_source']}): none {rows[0]['link_mb_none']:.1f} MB, "
          f"dedup {rows[0]['link_mb_dedup']:.1f} MB; codec {2 * args.kernels_ms[0] + args.kernels_ms[1] + args.kernels_ms[2]:.0f} ms (2 unique + expand + segment-sum)")
    plot_validation(rows, args.out / "validation.png")
    variants = [("error", f"codec from kernel rates ({rows[0]['codec_ms_kernels']:.0f} ms)"),
                ("fitted_error", f"codec fitted to the unshaped run ({rows[0]['codec_ms_fitted']:.0f} ms)")]
    if rows[0]["counted_ratio"] is not None:
        variants.append(("counted_error", f"codec counted in the run ({rows[0]['codec_ms_counted']:.0f} ms)"))
    for key, label in variants:
        worst = max(abs(r[key]) for r in rows)
        print(f"  {label}: worst |error| {100 * worst:.1f}% "
              f"({'within' if worst <= 0.15 else 'NOT within'} 15%)")
    return rows


def print_node_ratios(criteo: Path | None) -> list[dict]:
    """The node-level distinct fraction per shape and source, printed."""
    ratios = node_ratio_table(criteo)
    print("\nnode-level distinct fraction U(L*B) / (L*U(B)) (rows two levels send between nodes / one-level dedup's):")
    print(f"  {'L x B':>10} {'Criteo sample':>14} {'kaggle profile':>15} {'terabyte v1':>12} {'terabyte dcnv2':>15}")
    for r in ratios:
        crit = "-" if r["criteo"] is None else f"{r['criteo']:.3f}"
        print(f"  {r['ranks_per_node']:>4} x {r['batch']:<4} {crit:>14} {r['kaggle']:15.3f} "
              f"{r['terabyte']:12.3f} {r['terabyte_dcnv2']:15.3f}")
    if criteo is None:
        print("  (Criteo sample: pass --criteo PATH or set DLRMTRAIN_SHARED_DATA)")
    return ratios


def print_projection() -> list[dict]:
    """The cluster projection per model, fabric and size, with its goals, printed."""
    rows = project()
    print("\nprojection (assumptions in the script's header constants; step ratio = "
          "time-to-solution ratio, same steps):")
    print(f"  {'model':<8} {'fabric':<9} {'GPUs':>5} {'local b':>8} {'node U':>7} {'compute':>8} "
          f"{'a2a none':>9} {'dedup':>6} {'2-level':>8} {'codec d/2':>10} {'msgs n/2':>9} "
          f"{'none ms':>8} {'none/dedup':>11} {'none/2-level':>13} {'none/auto':>10} {'auto path':>10}")
    for r in rows:
        print(f"  {r['model']:<8} {r['fabric']:<9} {r['gpus']:5d} {r['local_batch']:8d} "
              f"{'-' if r['node_ratio'] is None else format(r['node_ratio'], '.3f'):>7} "
              f"{r['compute_ms']:8.2f} {r['none_comm_ms']:9.2f} {r['dedup_comm_ms']:6.2f} "
              f"{r['two_level_comm_ms']:8.2f} {r['dedup_codec_ms']:4.2f}/{r['two_level_codec_ms']:4.2f} "
              f"{r['none_messages']:4d}/{r['two_level_messages']:<4d} {r['none_ms']:8.2f} {r['speedup']:11.2f} "
              f"{r['speedup_two_level']:13.2f} {r['speedup_auto']:10.2f} {r['auto_path']:>10}")
    for model in GLOBAL_BATCH:
        for fabric in ("IB 400G",):
            cells = [r for r in rows if r["fabric"] == fabric and r["model"] == model and r["gpus"] in (64, 512)]
            print(f"  goal two-level >= 1.5x none at 64 and 512 GPUs, {fabric}, {model}: "
                  + ", ".join(f"{r['gpus']} GPUs {r['speedup_two_level']:.2f}x" for r in cells)
                  + (" (met)" if all(r["speedup_two_level"] >= 1.5 for r in cells) else " (NOT met)"))
    print(f"  auto / none never above 1.00: worst none/auto {min(r['speedup_auto'] for r in rows):.2f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    if args.sweep:
        result["validation"] = print_validation(args)
    if args.node_sweep:
        node_rows = [r for folder in args.node_sweep for r in validate_nodes(load_node_sweep(folder))]
        result["node_validation"] = node_rows
        print_node_validation(node_rows)
        plot_node_validation(node_rows, args.out / "validation_nodes.png")
    result["node_ratio"] = print_node_ratios(args.criteo)
    rows = print_projection()
    result["projection"] = rows
    (args.out / "project_cluster.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "project_cluster.png")
    print(f"\nwritten: {args.out / 'project_cluster.json'}, {args.out / 'project_cluster.png'}"
          + (f", {args.out / 'validation_nodes.png'}" if args.node_sweep else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
