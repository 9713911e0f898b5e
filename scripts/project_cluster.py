"""A step-time cost model for codec `none` vs `dedup`: validated against the shaped-link
sweep on this machine, then used to project 8 / 64 / 512 GPUs.

    python scripts/project_cluster.py --sweep /tmp/bench_link/sweep.json \\
        --kernels-ms UNIQUE EXPAND SEGSUM [--loopback-gbit 17] [--out docs/]

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
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

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
# Per-peer cost of one all-to-all (message setup, synchronisation), paid by both codecs
# alike: dedup sends as many messages, only shorter. Microseconds, assumed.
PEER_US = {"NVLink": 0.5, "IB 400G": 1.5, "Eth 100G": 4.0}
GLOBAL_BATCH = {"DLRM v1": 55296, "DCNv2": 65536}   # MLPerf reference global batches
# Samples/s one GPU trains with the all-to-all excluded (dense, lookups, optimizer):
# assumed, of the order of published 8-GPU MLPerf results (minutes per ~4e9 samples).
GPU_SAMPLES_PER_S = {"DLRM v1": 4.0e6, "DCNv2": 2.0e6}
HBM_GBYTE_PER_S = 3350 * 0.5   # H100 HBM3 at an assumed 50% for gather/scatter kernels
CODEC_FIXED_MS = 0.2           # launches + the one host sync per dist per step (assumed)
STEP_FIXED_MS = 0.3            # per-step launches, optimizer, input dist: paid at any batch (assumed)
SORT_BYTES_PER_ID = 64         # radix sort of int64 keys + index: ~4 passes x 16 B (assumed)
WIRE_BYTES = 4                 # fp32 rows, as dlrmtrain's lossless default sends


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


# ---------------------------------------------------------------- a cluster
def a2a_bytes_per_gpu(model: str, gpus: int, codec: str) -> tuple[float, float]:
    """(intra-node, inter-node) bytes one GPU sends per step, forward + backward."""
    local = GLOBAL_BATCH[model] // gpus
    sizes, exponents = profile_tables("terabyte", "dcnv2" if model == "DCNv2" else "v1")
    rows = 0.0
    for n, s in zip(sizes, exponents):
        frac = 1.0 if codec == "none" else expected_distinct_fraction(n, s, local)
        rows += frac * local
    # tables spread evenly: a sample's rows come from another GPU with prob (G-1)/G
    total = 2 * rows * DIM * WIRE_BYTES * (gpus - 1) / gpus
    if gpus <= GPUS_PER_NODE:
        return total, 0.0
    intra = total * (GPUS_PER_NODE - 1) / (gpus - 1)
    return intra, total - intra


def codec_ms_gpu(model: str, gpus: int) -> float:
    """dedup's kernels on one GPU: memory-bound expand + segment-sum and the id sort."""
    local = GLOBAL_BATCH[model] // gpus
    sizes, exponents = profile_tables("terabyte", "dcnv2" if model == "DCNv2" else "v1")
    moved = 0.0
    for n, s in zip(sizes, exponents):
        u = expected_distinct_fraction(n, s, local) * local
        moved += 2 * (u + local) * DIM * 4   # expand and segment-sum read + write
    ids = TABLES * local * (sum(MLPERF_DCNV2_MULTI_HOT_SIZES) / TABLES if model == "DCNv2" else 1)
    moved += 2 * ids * SORT_BYTES_PER_ID     # both ends rank their blocks' keys
    return CODEC_FIXED_MS + 1e3 * moved / (HBM_GBYTE_PER_S * 1e9)


def project() -> list[dict]:
    rows = []
    for model in GLOBAL_BATCH:
        for fabric, links in FABRICS.items():
            for gpus in GPUS:
                local = GLOBAL_BATCH[model] // gpus
                compute_ms = STEP_FIXED_MS + 1e3 * local / GPU_SAMPLES_PER_S[model]
                t = {}
                for codec in ("none", "dedup"):
                    intra, inter = a2a_bytes_per_gpu(model, gpus, codec)
                    if links["nic"] is None:  # all on NVLink
                        intra, inter = intra + inter, 0.0
                    nv = intra * 8 / (links["nvlink"] * 1e9 * LINK_EFFICIENCY)
                    nic = inter * 8 / (links["nic"] * 1e9 * LINK_EFFICIENCY) if inter else 0.0
                    # NVLink and NIC carry their parts concurrently; forward + backward
                    # all-to-all each pay the per-peer cost once
                    comm_ms = 1e3 * max(nv, nic) + 2 * (gpus - 1) * PEER_US[fabric] / 1e3
                    t[codec] = compute_ms + comm_ms + (codec_ms_gpu(model, gpus) if codec == "dedup" else 0)
                    t[codec + "_comm_ms"] = comm_ms
                rows.append({"model": model, "fabric": fabric, "gpus": gpus, "local_batch": local,
                             "compute_ms": compute_ms, "none_ms": t["none"], "dedup_ms": t["dedup"],
                             "none_comm_ms": t["none_comm_ms"], "dedup_comm_ms": t["dedup_comm_ms"],
                             "codec_ms": codec_ms_gpu(model, gpus),
                             "speedup": t["none"] / t["dedup"]})
    return rows


# ---------------------------------------------------------------- output
def plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("the plot needs matplotlib: .venv/bin/pip install -e '.[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, model in zip(axes, GLOBAL_BATCH):
        for fabric in FABRICS:
            pts = [r for r in rows if r["model"] == model and r["fabric"] == fabric]
            ax.plot([r["gpus"] for r in pts], [r["speedup"] for r in pts], "o-", label=fabric)
        ax.axhline(1.0, color="grey", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(GPUS), [str(g) for g in GPUS])
        ax.set_xlabel("GPUs (8 per node)")
        ax.set_title(f"{model}, global batch {GLOBAL_BATCH[model]} (model, not measured)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("predicted step time none / dedup (>1: dedup faster)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_validation(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("the plot needs matplotlib: .venv/bin/pip install -e '.[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", type=Path, help="bench_link.py's sweep.json (validation)")
    p.add_argument("--comm", type=Path, help="bench_comm.py --json of the swept shape (2 ranks)")
    p.add_argument("--kernels-ms", nargs=3, type=float, metavar=("UNIQUE", "EXPAND", "SEGSUM"),
                   help="bench_codec_kernels.py's CPU ms at the swept shape")
    p.add_argument("--loopback-gbit", type=float, default=17.0,
                   help="unshaped loopback rate (shaped_link's TCP probe measured ~17)")
    p.add_argument("--out", type=Path, default=Path("/tmp/project_cluster"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    if args.sweep:
        if not (args.comm and args.kernels_ms):
            p.error("--sweep needs --comm and --kernels-ms")
        rows = validate(json.loads(args.sweep.read_text()), json.loads(args.comm.read_text()),
                        tuple(args.kernels_ms), args.loopback_gbit)
        result["validation"] = rows
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
    rows = project()
    result["projection"] = rows
    print("\nprojection (assumptions in the script's header constants; step ratio = "
          "time-to-solution ratio, same steps):")
    print(f"  {'model':<8} {'fabric':<9} {'GPUs':>5} {'local b':>8} {'compute':>8} {'a2a none':>9} "
          f"{'a2a dedup':>10} {'codec':>6} {'none ms':>8} {'dedup ms':>9} {'none/dedup':>11}")
    for r in rows:
        print(f"  {r['model']:<8} {r['fabric']:<9} {r['gpus']:5d} {r['local_batch']:8d} "
              f"{r['compute_ms']:8.2f} {r['none_comm_ms']:9.2f} {r['dedup_comm_ms']:10.2f} "
              f"{r['codec_ms']:6.2f} {r['none_ms']:8.2f} {r['dedup_ms']:9.2f} {r['speedup']:11.2f}")
    (args.out / "project_cluster.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(rows, args.out / "project_cluster.png")
    print(f"\nwritten: {args.out / 'project_cluster.json'}, {args.out / 'project_cluster.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
