"""Every collective of a run has a backend on CUDA that serves its tensors (issue 26).

One spawned 2-rank group runs the matrix as short runs under a `CollectiveAudit`
(tests/multiproc/collective_audit.py): DLRM v1 with `none` (checkpointed, then
resumed), `dedup` (with a row-wise table), `auto`, two-level `dedup` (2 nodes of one
rank: comm.ranks_per_node=1) and `dedup` through `run.pipeline: sparse_dist`; DCNv2
with `dedup`; DLRMv4 with `none` (checkpointed, then resumed) and `dedup`. Each run
trains, evaluates, and reports its comm stats at its end. Judged under the default
group's CUDA backends (`env.backend_for`), no call is left without a backend for its
tensors; judged under the old NCCL-only default group, the comm stats' host sums are.
"""

from __future__ import annotations


import pytest
import torch

from dlrmtrain.distributed.env import backend_for
from tests.common import TINY, train_on_rank
from tests.multiproc import run_ranks
from tests.multiproc.collective_audit import refusals
from tests.multiproc.test_dlrmv4 import MINI, TINY as TINY_V4

SHORT = ["run.max_steps=2", "eval.evals_per_epoch=0", "logging.metrics_every_steps=1"]
V1 = {  # name: the run's overrides (run.name is the name's first word, so a resume finds its run)
    "v1_none": ["comm.codec=none", "checkpoint.at_end=true"],
    "v1_none resumed": ["comm.codec=none", "run.max_steps=3", "checkpoint.resume=true"],
    "v1_dedup": ["comm.codec=dedup", "comm.dedup_at=owner", "sharding.tables={t_cat_2: row_wise}"],
    "v1_auto": ["comm.codec=auto", "run.max_steps=8"],  # its probe ends: ranks agree
    "v1_two_level": ["comm.codec=dedup", "comm.hierarchy=node", "comm.ranks_per_node=1"],
    "v1_sparse_dist": ["comm.codec=dedup", "comm.dedup_at=owner", "run.pipeline=sparse_dist", "run.max_steps=3"],
    "dcnv2_dedup": ["model.arch=dlrm_dcnv2", "comm.codec=dedup", "comm.dedup_at=owner"],
}
V4 = {
    "v4_none": ["comm.codec=none", "checkpoint.at_end=true"],
    "v4_none resumed": ["comm.codec=none", "run.max_steps=3", "checkpoint.resume=true"],
    "v4_dedup": ["comm.codec=dedup", "comm.dedup_at=owner"],
}


def _audited_matrix(rank: int, world_size: int, out_dir: str) -> dict[str, list[dict]]:
    from tests.multiproc.collective_audit import CollectiveAudit

    runs: dict[str, list[dict]] = {}
    with CollectiveAudit() as audit:
        for config, base, matrix in ((None, TINY, V1), (MINI, TINY_V4, V4)):
            for name, overrides in matrix.items():
                start = len(audit.calls)
                train_on_rank(rank, world_size, config, [*base, *SHORT, f"run.output_dir={out_dir}",
                                                         f"run.name={name.split()[0]}", *overrides])
                runs[name] = audit.records()[start:]
    return runs


@pytest.fixture(scope="module")
def audited(tmp_path_factory) -> list[dict[str, list[dict]]]:
    return run_ranks(_audited_matrix, 2, str(tmp_path_factory.mktemp("audit")), timeout=500)


def _calls(audited, name=None) -> list[dict]:
    return [c for runs in audited for n, calls in runs.items() if name in (None, n) for c in calls]


def test_no_collective_of_the_matrix_lacks_a_backend_on_cuda(audited):
    assert refusals(_calls(audited), backend_for(torch.device("cuda"))) == []


def test_the_matrix_reaches_every_phase_and_the_collectives_that_matter(audited):
    for name in (*V1, *V4):
        calls = _calls(audited, name)
        phases = {c["phase"] for c in calls}
        assert {"setup", "train", "eval", "end"} <= phases, (name, phases)
        assert any(c["site"].startswith("dlrmtrain/comm/stats.py") and c["phase"] == "end" for c in calls), name
        assert any(c["site"] == "dlrmtrain/metrics/auc.py:gather_eval_outputs" for c in calls), name
    for name in ("v1_none", "v4_none"):
        assert "checkpoint" in {c["phase"] for c in _calls(audited, name)}, name
    for name in ("v1_none resumed", "v4_none resumed"):
        resumed = [c for c in _calls(audited, name) if c["phase"] == "resume"]
        assert {c["op"] for c in resumed} >= {"broadcast_object_list"}, name
        assert any(c["site"].startswith("torch/distributed/checkpoint/") for c in resumed), name
    # the row-wise dedup's flags, auto's agreement, the two levels' own groups: seen, and judged
    assert any(c["site"].startswith("dlrmtrain/comm/dedup/row_wise.py") for c in _calls(audited, "v1_dedup"))
    assert any(c["site"].startswith("dlrmtrain/comm/auto/dist.py") for c in _calls(audited, "v1_auto"))
    groups = [c for c in _calls(audited, "v1_two_level") if c["op"] == "new_group"]
    assert groups and all(c["site"].startswith("dlrmtrain/comm/topology.py") for c in groups)
    assert all(c["backend"] is None for c in groups)  # they inherit the default group's backends
    two_level = [c for c in _calls(audited, "v1_two_level") if c["group"] != "world" and c["op"] != "new_group"]
    assert two_level and all(c["devices"] == ("cuda",) for c in two_level)


def test_an_nccl_only_default_group_would_refuse_the_comm_stats_host_sums(audited):
    """The old config (`nccl` alone on CUDA): every run ends in a refused host-side sum."""
    old = refusals(_calls(audited), "nccl")
    assert old and all("comm/stats.py" in line for line in old), old[:5]
    assert len(old) >= 2 * len((*V1, *V4))  # at least the counters' and the timings' sums, each run


# ---- the backend config itself, on real groups (a world of one) -------------------------

STAND_IN = "nccl_stand_in"
"""A backend registered for the cuda device type in NCCL's place (this machine has no
NCCL): torch's dispatch then routes and refuses by device type as it does with NCCL."""


def _world_of_one(backend: str) -> None:
    import torch.distributed as dist
    from torch.distributed import ProcessGroupGloo

    if dist.is_initialized():  # the harness's Gloo group: replaced by the config under test
        dist.destroy_process_group()
    if not hasattr(dist.Backend, STAND_IN.upper()):
        dist.Backend.register_backend(STAND_IN, lambda store, rank, size, timeout:
                                      ProcessGroupGloo(store, rank, size, timeout), devices=["cuda"])
    dist.init_process_group(backend.replace("nccl", STAND_IN), store=dist.HashStore(), rank=0, world_size=1)


def _stats_sum_under_each_config(rank: int, world_size: int) -> dict:
    """The comm stats' host sum on the default group and on a node group made as
    comm/topology.py makes them, under the CUDA config and under the old NCCL-only one."""
    import torch.distributed as dist

    from dlrmtrain.comm.stats import TableCommStats, _sum_over_ranks

    _world_of_one(backend_for(torch.device("cuda")))
    node_group = dist.new_group([0])  # no backend: inherited
    tables = {"t_cat_0": TableCommStats(bags=3)}
    out = {"backends": (dist.get_backend(), dist.get_backend(node_group)),
           "sums": (_sum_over_ranks(tables, [0.5], None), _sum_over_ranks(tables, [0.5], node_group)),
           "bags": tables["t_cat_0"].bags}
    _world_of_one("nccl")
    try:
        _sum_over_ranks(tables, [0.5], None)
        out["nccl alone"] = "served"
    except RuntimeError as e:
        out["nccl alone"] = str(e)
    dist.destroy_process_group()
    return out


def test_groups_inherit_both_backends_and_an_nccl_only_group_refuses_the_stats_sum():
    (out,) = run_ranks(_stats_sum_under_each_config, 1, timeout=120)
    assert out["backends"] == (f"cpu:gloo,cuda:{STAND_IN}",) * 2  # the node group inherits both
    assert out["sums"] == ([0.5], [0.5]) and out["bags"] == 3    # through Gloo
    # what every GPU run met at its end before (issue 26), with the old default group
    assert "No backend type associated with device type cpu" in out["nccl alone"]


def test_a_cuda_run_binds_its_gpu_and_a_cpu_run_stays_on_gloo():
    from dlrmtrain.distributed.env import group_options

    gpu = torch.device("cuda", 3)
    assert group_options(gpu) == {"backend": "cpu:gloo,cuda:nccl", "device_id": gpu}
    assert group_options(torch.device("cpu")) == {"backend": "gloo"}
