"""`dlrmtrain plan`: a config's sharding plan and memory on a cluster of GPUs, before launch.

    dlrmtrain plan --config C --gpus G --gpu-memory-gb M [--gpus-per-node K]
                   [--host-memory-gb H] [key=value ...]

Prints the plan TorchRec's planner makes for G CUDA GPUs of M GB (GB: 2**30 bytes, as the
memory check prints them; the CUDA context and the allocator's slack are not counted, so
leave a margin), each GPU's memory by part, a verdict, and when it does not fit what would.
Exit 0: it fits; 1: it does not; 2: a bad config or option.
"""

from __future__ import annotations

import argparse
import sys

import torch

from dlrmtrain.config import ConfigError, load_config
from dlrmtrain.config.schema import Config
from dlrmtrain.distributed.planner import Cluster
from dlrmtrain.models.activation_memory import gib
from dlrmtrain.plan.remedies import remedies
from dlrmtrain.plan.sizing import RankMemory, Sizing
from dlrmtrain.run.errors import SetupError
from dlrmtrain.run.machine import MemoryPart, activation_part, check_model_fits, dense_part

EXIT_DOES_NOT_FIT = 1
EXIT_CONFIG_ERROR = 2
DEFAULT_HOST_GB = 128.0
"""Host memory per GPU when not given: TorchRec's Topology default (its DDR_CAP)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlrmtrain plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="run config (YAML)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster")
    p.add_argument("--gpu-memory-gb", type=float, required=True, help="each GPU's memory, GB (2**30 bytes)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: min(8, --gpus))")
    p.add_argument("--host-memory-gb", type=float, default=DEFAULT_HOST_GB,
                   help=f"host memory per GPU, GB, where UVM-cached tables live (default {DEFAULT_HOST_GB:g})")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    return p


def load(args: argparse.Namespace) -> tuple[Config, Cluster]:
    """The config as a CUDA run of `args.gpus` ranks reads it, checked where the plan depends on it."""
    from dlrmtrain.config import checks
    from dlrmtrain.distributed.sharding_checks import check_sharding_config
    from dlrmtrain.validation import resolve_config
    from dlrmtrain.workloads import workload_of

    if args.gpus < 1 or args.gpu_memory_gb <= 0 or args.host_memory_gb < 0:
        raise ConfigError("--gpus must be at least 1, --gpu-memory-gb above 0, --host-memory-gb not negative")
    per_node = args.gpus_per_node or min(8, args.gpus)
    if per_node < 1 or args.gpus % per_node:
        raise ConfigError(f"--gpus-per-node: {per_node} does not divide --gpus {args.gpus}")
    cfg = resolve_config(load_config(args.config, args.overrides))
    cfg.run.device = "cuda"  # planned for GPUs, whatever machine runs the command
    if cfg.run.global_batch_size % args.gpus:
        raise ConfigError(f"run.global_batch_size: {cfg.run.global_batch_size} does not divide by "
                          f"{args.gpus} GPUs")
    workload = workload_of(cfg)
    checks.check_model(cfg)
    workload.check_model(cfg)
    workload.check_device(cfg, "cuda")
    checks.check_table_keys(cfg, workload.table_names(cfg))
    check_sharding_config(cfg, args.gpus, "cuda")
    workload.check_sharding(cfg)
    gb = 2**30
    return cfg, Cluster(args.gpus, per_node, int(args.gpu_memory_gb * gb), int(args.host_memory_gb * gb))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg, cluster = load(args)
    except (ConfigError, ValueError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    fits = report(args.config, Sizing(cfg), cfg, cluster)
    return 0 if fits else EXIT_DOES_NOT_FIT


def report(name: str, sizing: Sizing, cfg: Config, cluster: Cluster) -> bool:
    """Print the plan, the memory per GPU, the verdict and the remedies; True: it fits."""
    local = cfg.run.global_batch_size // cluster.gpus
    print(f"dlrmtrain plan: {name} ({cfg.model.arch}) on {cluster.gpus} × {gib(cluster.hbm_bytes)} GPUs, "
          f"{cluster.gpus_per_node} per node, {gib(cluster.host_bytes)} host memory per GPU; local batch "
          f"{local:,} (run.global_batch_size {cfg.run.global_batch_size:,}), {cfg.precision.mode}")
    plan, note = sizing.plan(cfg, cluster, local)
    by_hand = "; the run itself plans by hand, sharding.planner manual" if cfg.sharding.planner == "manual" else ""
    print(f"sharding plan (TorchRec's EmbeddingShardingPlanner, within the config's sharding types{by_hand}):")
    lines = _plan_lines(plan, sizing) if plan is not None else []
    print("\n".join(lines + ([f"  ({note})" if lines else f"  {note}"] if note else [])))
    activations = sizing.activations(cfg, local)
    print(f"activations per GPU: {activations.describe()}")
    ranks = sizing.ranks(cfg, plan, cluster, local) if plan is not None else None
    if ranks is not None:
        print("\n".join(_rank_lines(ranks, cluster)))
    verdict = _verdict(sizing, cfg, cluster, ranks)
    if verdict is None:
        print("verdict: fits")
        return True
    print(f"verdict: does not fit: {verdict}")
    _print_remedies(sizing, cfg, cluster, ranks, activations.peak)
    return False


def _print_remedies(sizing: Sizing, cfg: Config, cluster: Cluster, ranks: list[RankMemory] | None,
                    activations: int) -> None:
    """What would fit, as configured and under each of the family's lighter settings that is
    lighter at this batch (a kernel's fixed scratch can outweigh what it saves on a small run)."""
    largest = max(ranks, key=lambda r: r.gpu) if ranks else None
    tables = largest.tables + largest.optimizer if largest else None
    local = cfg.run.global_batch_size // cluster.gpus
    settings = [("as configured", cfg)] + [
        (f"with {key}", lighter) for key, lighter in sizing.workload.lighter_settings(cfg, "cuda")
        if sizing.activations(lighter, local).peak < activations]
    print(f"what would fit on {gib(cluster.hbm_bytes)} GPUs:")
    for label, setting in settings:
        print(f"  {label}:")
        print("\n".join(f"    {line}" for line in remedies(sizing, setting, cluster, tables)))


def _plan_lines(plan, sizing: Sizing) -> list[str]:
    """One line per table: rows, sharding type, kernel (a cache's load factor), its ranks."""
    lines = []
    for module_plan in plan.plan.values():
        for table in sizing.rows:
            ps = module_plan[table]
            ranks = sorted(set(ps.ranks)) if ps.ranks else []
            where = (f"ranks {ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1))
                     else f"ranks {ranks}" if len(ranks) > 1 else f"rank {ranks[0]}" if ranks else "every rank")
            cache = f" (cache {ps.cache_params.load_factor:g})" if ps.cache_params and ps.cache_params.load_factor else ""
            lines.append(f"  {table:<22} {sizing.rows[table]:>13,} rows  {ps.sharding_type:<13} "
                         f"{ps.compute_kernel}{cache:<12} {where}")
    return lines


def _rank_lines(ranks: list[RankMemory], cluster: Cluster) -> list[str]:
    """The memory table: every GPU (or, past 16, the first 8 and the largest), in GB (MB for
    GPUs under 16 GB)."""
    unit, scale = ("GB", 2**30) if cluster.hbm_bytes >= 16 * 2**30 else ("MB", 2**20)
    lines = [f"memory per GPU, {unit} of {cluster.hbm_bytes / scale:,.1f}:",
             f"  {'rank':<6}{'tables':>10}{'optimizer':>11}{'dense':>9}{'activations':>13}{'total':>11}"
             f"{'host (UVM)':>12}  shards"]
    largest = max(ranks, key=lambda r: r.gpu)
    shown = ranks if len(ranks) <= 16 else ranks[:8] + ([largest] if largest.rank >= 8 else [])
    for r in shown:
        names = ", ".join(r.table_names) if len(r.table_names) <= 4 else f"{len(r.table_names)} shards"
        lines.append(f"  {r.rank:<6}" + "".join(f"{v / scale:>{w},.1f}" for v, w in (
            (r.tables, 10), (r.optimizer, 11), (r.dense, 9), (r.activations, 13), (r.gpu, 11), (r.host, 12)))
            + f"  {names}")
    if len(shown) < len(ranks):
        lines.append(f"  ({len(ranks) - len(shown)} more GPUs, none above rank {largest.rank}'s)")
    lines.append(f"  largest: rank {largest.rank}, {gib(largest.gpu)} of {gib(cluster.hbm_bytes)}")
    return lines


def _verdict(sizing: Sizing, cfg: Config, cluster: Cluster, ranks: list[RankMemory] | None) -> str | None:
    """None when the largest GPU fits, else the memory check's line for it (or, with no plan,
    for the run's own check: the tables spread evenly)."""
    local = cfg.run.global_batch_size // cluster.gpus
    if ranks is None:
        parts = sizing.workload.memory_parts(cfg, sizing.rows, cluster.gpus, "cuda")
    else:
        r = max(ranks, key=lambda r: r.gpu)
        tables = MemoryPart("the embedding tables", r.tables + r.optimizer,
                            f"rank {r.rank}'s table shards need {gib(r.tables)} for their fp32 weights (or "
                            f"their UVM caches) and {gib(r.optimizer)} for their optimizer state",
                            f"{sizing.workload.shrink_tables}, use more GPUs, or sharding.uvm_caching")
        parts = [tables, dense_part(sizing.dense_parameters, sizing.dense_state),
                 activation_part(sizing.activations(cfg, local))]
    try:
        check_model_fits(parts, torch.device("cuda"), available=cluster.hbm_bytes)
    except SetupError as e:
        return str(e)
    return None
