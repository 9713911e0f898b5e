"""`sharding.uvm_caching` (issue 42, item 3): TorchRec's fused_uvm_caching kernel as a
sharding choice, by name or by size. A CUDA run's plan carries it (kernel and cache load
factor, under either planner); a CPU run refuses it by name, because fbgemm's CPU build has
no UVM kernel (checked below, so the refusal is revisited if a build gains one); the memory
check counts a cached table by its cache."""

from __future__ import annotations

import pytest
import torch

from dlrmtrain.config import load_config
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.distributed.planner import Cluster, build_sharding_plan, plan_on_cluster
from dlrmtrain.validation import resolve_config, validate_config
from dlrmtrain.workloads import workload_of
from tests.config.test_workloads import PACKAGE

MINI_V4 = PACKAGE.parent / "configs/mini_dlrmv4.yaml"
CACHED = ["sharding.uvm_caching.tables=[item_id]", "sharding.uvm_caching.min_rows=20000",
          "sharding.uvm_caching.load_factor=0.3"]
"""item_id (12,000 rows) by name, and the seven 20,000-row crosses by size."""
BIG = {"item_id", "user_x_artist", "user_x_album", "user_x_hour", "item_x_hour", "artist_x_hour",
       "user_x_is_organic", "user_x_artist_x_hour"}


@pytest.mark.parametrize("key, overrides", [
    ("tables", ["sharding.uvm_caching.tables=[item_id]"]),
    ("min_rows", ["sharding.uvm_caching.min_rows=1000"]),
])
def test_a_cpu_run_refuses_uvm_caching_by_name(key, overrides):
    cfg = load_config(MINI_V4, ["run.device=cpu", *overrides])
    with pytest.raises(ConfigError, match=rf"^sharding\.uvm_caching\.{key}: fused_uvm_caching runs on CUDA "
                                          r"only: fbgemm's CPU build has no UVM kernel"):
        validate_config(cfg, 2)
    validate_config(load_config(MINI_V4, ["run.device=cuda", *overrides]), 2)  # a CUDA run takes it


def test_fbgemms_cpu_build_has_no_uvm_kernel():
    """What the refusal says: no managed (UVM) tensor on CPU, and the CPU lookup takes host tables only."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice, EmbeddingLocation, SplitTableBatchedEmbeddingBagsCodegen)

    with pytest.raises(NotImplementedError, match="new_managed_tensor.*CPU"):
        torch.ops.fbgemm.new_managed_tensor(torch.empty(0), [4, 4])
    with pytest.raises(AssertionError, match="ComputeDevice.CPU is only for EmbeddingLocation.HOST"):
        SplitTableBatchedEmbeddingBagsCodegen([(100, 8, EmbeddingLocation.MANAGED_CACHING, ComputeDevice.CPU)])


def _model_and_sharder(cfg):
    workload = workload_of(cfg)
    rows = workload.planned_table_rows(cfg)
    return workload.build_model(cfg, rows, torch.device("meta")), *workload.embedding_sharder(cfg, "cuda")


@pytest.mark.parametrize("planner", ["manual", "torchrec"])
def test_a_cuda_plan_looks_the_named_and_the_large_tables_up_through_the_cache(planner):
    cfg = resolve_config(load_config(MINI_V4, ["run.device=cuda", f"sharding.planner={planner}", *CACHED]))
    model, sharder, path = _model_and_sharder(cfg)
    if planner == "manual":
        plan = build_sharding_plan(model, cfg.sharding, 2, "cuda", sharder, module_path=path)
    else:
        plan = plan_on_cluster(model, path, cfg.sharding, sharder, Cluster(2, 2, 2**30, 2**30), 0, 64)
    kernels = {t: (ps.compute_kernel, ps.cache_params.load_factor if ps.cache_params else None)
               for t, ps in plan.plan[path].items()}
    assert {t for t, (kernel, _) in kernels.items() if kernel == "fused_uvm_caching"} == BIG
    assert all(lf == 0.3 for t, (_, lf) in kernels.items() if t in BIG)
    assert all(kernels[t] == ("fused", None) for t in set(kernels) - BIG)


@pytest.mark.parametrize("overrides, message", [
    (["sharding.uvm_caching.load_factor=0"], r"sharding\.uvm_caching\.load_factor: must be in \(0, 1\]"),
    (["sharding.uvm_caching.tables=[no_table]"], r"sharding\.uvm_caching\.tables: 'no_table': no such table"),
    (["sharding.uvm_caching.tables=[uid]", "sharding.tables={uid: data_parallel}"],
     r"sharding\.uvm_caching\.tables: uid is data_parallel .*only a sharded table can be UVM-cached"),
])
def test_what_uvm_caching_cannot_honour_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(MINI_V4, ["run.device=cuda", *overrides]), 2)


def test_a_size_that_takes_a_data_parallel_table_is_refused_when_the_plan_is_built():
    cfg = resolve_config(load_config(MINI_V4, ["run.device=cuda", "sharding.uvm_caching.min_rows=8000",
                                               "sharding.tables={uid: data_parallel}"]))
    model, sharder, path = _model_and_sharder(cfg)
    with pytest.raises(ConfigError, match=r"sharding\.uvm_caching\.min_rows: 8,000 takes the data_parallel "
                                          r"table uid \(8,192 rows\)"):
        build_sharding_plan(model, cfg.sharding, 2, "cuda", sharder, module_path=path)


def test_the_memory_check_counts_a_cached_table_by_its_cache():
    cfg = load_config(PACKAGE.parent / "configs/mlperf_dlrmv4.yaml",
                      ["sharding.uvm_caching.min_rows=20000000", "sharding.uvm_caching.load_factor=0.25"])
    workload = workload_of(cfg)
    rows = workload.planned_table_rows(cfg)
    cached = {t for t, n in rows.items() if n >= 20_000_000}
    tables = workload.memory_parts(cfg, rows, 8, "cuda")[0]
    expected = sum(n * 512 * 4 * (0.25 if t in cached else 1) + 4 * n for t, n in rows.items()) / 8  # + row-wise state
    assert tables.nbytes == pytest.approx(expected, rel=1e-6)
    assert "6 of them UVM-cached (sharding.uvm_caching)" in tables.lead
