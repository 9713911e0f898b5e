"""DLRMv4 (HSTU on synthetic Yambda) through the one Trainer, on real Gloo ranks.

configs/mini_dlrmv4.yaml at a tiny size (64 users, global batch 32, dropout off so
ranks draw no random masks, every history equally long): the row-wise sharded
EmbeddingCollection on 2 ranks trains as a single process does on the same global
batches; the `dedup` sequence all-to-all gives the same loss as `none` (bitwise at
step 1: same weights, lossless forward), under the config's attention and under
`blocked`; a table read once per sample trained data-parallel gives the sharded run's losses; a checkpoint of the sharded tables and both
optimizers (Adam, RowWiseAdagrad) resumes the same trajectory; TorchRec's sparse_dist and
fused_sparse_dist pipelines train the plain loop's numbers bitwise under the warmup's changing
rate, evaluations in between; `auto` settled on dedup plans its sequence all-to-all ahead
under sparse_dist (no codec host sync in a step after its decision), bitwise the plain loop. (The end-to-end command-line run, with dedup, the
MLPerf log and a checkpoint, is in tests/mlperf/test_trainer_mlperf_log.py.)

Equal history lengths: the STU attention divides by the batch's longest sequence (as
the reference), so a rank's half batch and the whole batch agree only when their
longest sequences do. The 1-vs-2-rank run uses SGD (dense and fused): Adam's and
RowWiseAdagrad's first steps are g / |g|, blind to a wrongly scaled gradient.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.common import train_on_rank
from tests.multiproc import run_ranks

REPO = Path(__file__).resolve().parents[2]
MINI = str(REPO / "configs" / "mini_dlrmv4.yaml")
TINY = ["data.yambda.synthetic.num_users=64", "data.yambda.synthetic.min_history_fraction=1.0",
        "run.global_batch_size=32", "eval.batch_size=64", "model.hstu.input_dropout=0",
        "model.hstu.linear_dropout=0", "optim.warmup_steps=2", "logging.metrics_every_steps=1",
        "logging.progress_bar=false"]
STEPS = 4
NO_EVAL = ["eval.enabled=false", f"run.max_steps={STEPS}"]
SGD = ["optim.name=sgd", "optim.lr=0.5", "optim.grad_clip_norm=null"]


ATTENTION_KINDS_ALSO = ("blocked",)
"""model.hstu.attention kinds run beside the config's own (`auto`: padded at 64 rows on CPU)."""
KIND_STEPS = 2
"""Steps of those runs: the first is the bitwise claim, the second trains on its update."""


def _losses(summary: dict) -> list[float]:
    return [loss for _step, loss in summary["losses"]]


AUTO_STEPS = 7


def _train_auto(rank: int, world_size: int, out_dir: str, pipeline: str, dedup_at: str = "owner") -> dict:
    """`auto` decided dedup at step 4 whatever the clock says (tests/comm/test_plan_ahead.py's
    policy), each step's codec host syncs counted; at the owner (its dists) or the source (the
    loader's two forms, `SourceAuto`)."""
    from dlrmtrain.comm.auto.dist import AutoDist
    from dlrmtrain.config import load_config
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config, validate_config
    from tests.comm.test_plan_ahead import forced_policy, syncs_per_call

    cfg = resolve_config(load_config(MINI, [
        *TINY, "eval.enabled=false", f"run.max_steps={AUTO_STEPS}", f"run.output_dir={out_dir}",
        f"run.name=auto_{dedup_at}_{pipeline}", "comm.codec=auto", f"comm.dedup_at={dedup_at}",
        f"run.pipeline={pipeline}"]))
    validate_config(cfg, world_size)
    trainer = Trainer(cfg, init_distributed("cpu"))
    dists = trainer.comm_counters.of_type(AutoDist)
    for d in dists:
        d.policy = forced_policy("dedup")
    if trainer.source_auto is not None:
        trainer.source_auto.policy = forced_policy("dedup")
    syncs: list = []
    if trainer.pipeline is not None:
        trainer.pipeline.progress = syncs_per_call(trainer.pipeline.progress, syncs)
    else:
        trainer.train_step = syncs_per_call(trainer.train_step, syncs)
    summary = trainer.train().as_dict()
    policies = [d.policy for d in dists] + ([trainer.source_auto.policy] if trainer.source_auto else [])
    out = {"losses": summary["losses"], "syncs": syncs,
           "decisions": [[(x.step, x.choice) for x in p.decisions] for p in policies],
           "planned_ahead": [d.dedup_dist.comm_stats.planned_ahead for d in dists]}
    if rank == 0:  # the run records are rank 0's
        out["comm_stats"] = json.loads((Path(out_dir) / f"auto_{dedup_at}_{pipeline}" / "comm_stats.json").read_text())
    trainer.close()
    del trainer, dists
    return out


def _scenarios(rank: int, world_size: int, out_dir: str) -> dict:
    def train(name: str, *overrides: str) -> dict:
        return train_on_rank(rank, world_size, MINI, [*TINY, *NO_EVAL, f"run.output_dir={out_dir}",
                                                     f"run.name={name}", *overrides])

    runs = {"sgd": train("sgd", *SGD)}
    if world_size == 1:
        return runs
    runs["none"] = train("full", "comm.codec=none")
    # one table read once per sample replicated (dense kernel, dense optimizer: SGD as the fused one)
    runs["data parallel"] = train("dp", *SGD, "sharding.tables.uid=data_parallel")
    if rank == 0:
        runs["data parallel"]["plan"] = (Path(out_dir) / "dp" / "plan.txt").read_text()
    # TorchRec's sparse_dist pipeline against the plain loop, evals every 2 steps (each one
    # detaches and re-attaches the pipeline with the next batch's ids in flight)
    for pipeline in ("off", "sparse_dist", "fused_sparse_dist"):
        runs[f"pipeline {pipeline}"] = train(f"pipe_{pipeline}", f"run.pipeline={pipeline}",
                                             "eval.enabled=true", "eval.evals_per_epoch=8")
    runs["pipeline dedup"] = train("pipe_dedup", "run.pipeline=sparse_dist", "comm.codec=dedup",
                                    "comm.dedup_at=owner")
    if rank == 0:  # the run records are rank 0's
        runs["pipeline dedup"]["comm_stats"] = json.loads(
            (Path(out_dir) / "pipe_dedup" / "comm_stats.json").read_text())
    runs["dedup"] = train("dedup", "comm.codec=dedup", "comm.dedup_at=owner")
    for kind in ATTENTION_KINDS_ALSO:  # the same comparison under the other CPU attention
        steps = f"run.max_steps={KIND_STEPS}"
        runs[f"none {kind}"] = train(f"none_{kind}", "comm.codec=none", f"model.hstu.attention={kind}", steps)
        runs[f"dedup {kind}"] = train(f"dedup_{kind}", "comm.codec=dedup", "comm.dedup_at=owner",
                                      f"model.hstu.attention={kind}", steps)
    # dedup at the source (the loader's distinct ids): only they cross, through TorchRec's own dists
    runs["source"] = train("source", "comm.codec=dedup", "comm.dedup_at=source")
    runs["source sparse_dist"] = train("source_pipe", "comm.codec=dedup", "comm.dedup_at=source",
                                       "run.pipeline=sparse_dist", "eval.enabled=true", "eval.evals_per_epoch=8")
    if rank == 0:
        for name, folder in (("source", "source"), ("none", "full")):
            runs[name]["comm_stats"] = json.loads((Path(out_dir) / folder / "comm_stats.json").read_text())
    for pipeline in ("off", "sparse_dist"):
        runs[f"auto {pipeline}"] = _train_auto(rank, world_size, out_dir, pipeline)
    runs["auto source"] = _train_auto(rank, world_size, out_dir, "sparse_dist", "source")
    train("split", f"run.max_steps={STEPS // 2}", "checkpoint.at_end=true")
    runs["resumed"] = train("split", "checkpoint.resume=true")
    # checkpointed under dedup at the owner, resumed at the source (the same tables and state)
    train("switch", "comm.codec=dedup", "comm.dedup_at=owner", f"run.max_steps={STEPS // 2}",
          "checkpoint.at_end=true")
    runs["switched"] = train("switch", "comm.codec=dedup", "comm.dedup_at=source", "checkpoint.resume=true")
    return runs


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_ranks(_scenarios, 2, str(tmp_path_factory.mktemp("two")), timeout=360)


def test_two_sharded_ranks_train_as_one_process(two_ranks, tmp_path):
    (single,) = run_ranks(_scenarios, 1, str(tmp_path), timeout=180)
    one, two = _losses(single["sgd"]), _losses(two_ranks[0]["sgd"])
    assert len(two) == STEPS and two == _losses(two_ranks[1]["sgd"])  # every rank: the global mean
    # Same model and global batches; only the order of float sums differs across ranks.
    assert two == pytest.approx(one, rel=1e-5, abs=1e-6)
    assert one[0] != one[-1]  # it did train


def test_a_data_parallel_table_read_once_per_sample_trains_as_a_sharded_one(two_ranks):
    """validation refuses data_parallel for a history table or a second table (fbgemm's dense CPU
    lookup pools, sample-major); one table read once per sample takes it and trains as sharded."""
    sharded, replicated = _losses(two_ranks[0]["sgd"]), _losses(two_ranks[0]["data parallel"])
    assert replicated[0] == sharded[0]  # same weights, the same rows looked up: bitwise
    assert replicated == pytest.approx(sharded, rel=1e-5, abs=1e-6)  # gradients summed in another order
    assert replicated == _losses(two_ranks[1]["data parallel"])
    replicated_tables = [line.split()[0] for line in two_ranks[0]["data parallel"]["plan"].splitlines()[1:]
                         if line.split()[1] == "data_parallel"]
    assert replicated_tables == ["uid"]


def test_dedup_sequence_all_to_all_gives_the_loss_of_none(two_ranks):
    none, dedup = _losses(two_ranks[0]["none"]), _losses(two_ranks[0]["dedup"])
    assert dedup[0] == none[0]  # lossless forward, same weights: bitwise
    # afterwards the embedding gradients' sums come in another order: fp32 rounding
    assert dedup == pytest.approx(none, rel=1e-5, abs=1e-6)
    assert two_ranks[0]["dedup"]["codec"] == "dedup"


@pytest.mark.parametrize("kind", ATTENTION_KINDS_ALSO)
def test_dedup_gives_the_loss_of_none_under_each_attention(two_ranks, kind):
    none, dedup = _losses(two_ranks[0][f"none {kind}"]), _losses(two_ranks[0][f"dedup {kind}"])
    assert len(none) == KIND_STEPS and dedup[0] == none[0]  # lossless forward, same weights: bitwise
    assert dedup == pytest.approx(none, rel=1e-5, abs=1e-6)
    # the same model as padded's up to fp32 rounding: blocked sums over keys in its own order and
    # scales by α and 1/N at other points (which kernel a config builds: test_hstu_attention_blocked.py)
    assert none == pytest.approx(_losses(two_ranks[0]["none"])[:KIND_STEPS], rel=1e-4, abs=1e-5)


def test_source_dedup_of_the_loaders_distinct_ids_gives_the_loss_of_none(two_ranks):
    none, source = two_ranks[0]["none"], two_ranks[0]["source"]
    assert _losses(source)[0] == _losses(none)[0]  # lossless forward, same weights: bitwise
    assert _losses(source) == pytest.approx(_losses(none), rel=1e-5, abs=1e-6)
    counted, stock = source["comm_stats"], none["comm_stats"]
    assert counted["codecs"] == ["dedup"] and stock["codecs"] == ["none"]
    # every position crosses under none; only each table's distinct ids at the source
    assert stock["ids_sent_per_step"] == stock["total"]["bags"] / STEPS
    assert counted["ids_sent_per_step"] == counted["total"]["unique_bags"] / STEPS < stock["ids_sent_per_step"]
    assert counted["rows_looked_up_per_step"] == counted["rows_sent_per_step"] < stock["rows_looked_up_per_step"]
    assert counted["total"]["bags"] == stock["total"]["bags"]
    # TorchRec's pipeline carries the batch's expansion (reverse indices) across its stages
    assert _losses(two_ranks[0]["source sparse_dist"]) == _losses(source)  # bitwise
    # its evaluations (each a detach and re-attach) take the loader's distinct ids too
    evals, none_evals = two_ranks[0]["source sparse_dist"]["evals"], two_ranks[0]["pipeline sparse_dist"]["evals"]
    assert len(evals) == 2 and [e["auc"] for e in evals] == pytest.approx([e["auc"] for e in none_evals], abs=1e-4)
    # a run checkpointed under dedup at the owner resumes at the source
    switched = _losses(two_ranks[0]["switched"])
    assert len(switched) == STEPS - STEPS // 2
    assert switched == pytest.approx(_losses(source)[STEPS // 2:], rel=1e-5, abs=1e-6)


def test_sparse_dist_pipelines_train_the_plain_loops_numbers(two_ranks):
    plain = two_ranks[0]["pipeline off"]
    for pipeline in ("sparse_dist", "fused_sparse_dist"):
        piped = two_ranks[0][f"pipeline {pipeline}"]
        assert len(_losses(piped)) == STEPS and _losses(piped) == _losses(plain), pipeline  # bitwise
        assert [e["auc"] for e in piped["evals"]] == [e["auc"] for e in plain["evals"]], pipeline
        assert len(piped["evals"]) == 2  # steps 2 and 4
    # sequence dedup plans batch i+1 during step i: after the first step, which fills the
    # pipeline and plans in its forward, no codec host sync is left on a step's critical path
    stats = two_ranks[0]["pipeline dedup"]["comm_stats"]
    assert stats["steps"] == STEPS and stats["planned_ahead_steps"] == STEPS - 1
    assert stats["host_syncs_per_step"] == pytest.approx(1 / STEPS)
    assert _losses(two_ranks[0]["pipeline dedup"]) == _losses(two_ranks[0]["dedup"])


def test_auto_settled_on_dedup_plans_the_sequence_all_to_all_ahead(two_ranks):
    from tests.comm.test_plan_ahead import AUTO_DECIDES_AT

    for rank, runs in enumerate(two_ranks):
        plain, piped = runs["auto off"], runs["auto sparse_dist"]
        assert len(_losses(piped)) == AUTO_STEPS and _losses(piped) == _losses(plain), rank  # bitwise
        assert piped["decisions"] == plain["decisions"] == [[(AUTO_DECIDES_AT - 1, "dedup")]]
        # after the decision's step (its agreement is auto's own host sync) no codec host sync
        # is left on a step's critical path: the next pass's plan is made ahead
        for critical, ahead in piped["syncs"][AUTO_DECIDES_AT:]:
            assert critical == [] and ahead == ["tolist"], (rank, piped["syncs"])
        assert all(critical for critical, _ in plain["syncs"][AUTO_DECIDES_AT:])  # plain: planned in-step
        # plans made ahead and used: step 2, the decision's step 4, and every later one
        assert piped["planned_ahead"] == [AUTO_STEPS - 2] and plain["planned_ahead"] == [0]


def test_auto_at_the_source_chooses_records_and_trains_as_none(two_ranks):
    """`comm.codec: auto`, `comm.dedup_at: source`, pipelined: the loader makes both forms, the
    probe trains on each (warm-up and probe: dedup, dedup, none), every rank takes the agreed
    choice at the same step, comm_stats.json records it, and the losses are `none`'s (the first
    bitwise; then the summation order of the distinct ids' gradients differs). No codec host
    sync on a step's thread, whichever form it took."""
    from tests.comm.test_plan_ahead import AUTO_DECIDES_AT

    none = _losses(two_ranks[0]["none"])
    for rank, runs in enumerate(two_ranks):
        auto = runs["auto source"]
        assert auto["decisions"] == [[(AUTO_DECIDES_AT - 1, "dedup")]], rank
        assert _losses(auto)[0] == none[0]
        assert _losses(auto)[:STEPS] == pytest.approx(none, rel=1e-5, abs=1e-6)
        assert all(critical == [] for critical, _ in auto["syncs"]), (rank, auto["syncs"])
    assert _losses(two_ranks[1]["auto source"]) == _losses(two_ranks[0]["auto source"])
    stats, source = two_ranks[0]["auto source"]["comm_stats"], two_ranks[0]["source"]["comm_stats"]
    assert stats["codecs"] == ["auto"]
    assert len(stats["auto_decisions"]) == 1, stats["auto_decisions"]
    assert stats["auto_decisions"][0].startswith(f"source step {AUTO_DECIDES_AT - 1}: dedup ("), stats
    # every training step from the decision on is counted as trained: the pipeline picked one
    # batch two steps ahead, before the first decision, in the probe's turn (none)
    after = AUTO_STEPS - (AUTO_DECIDES_AT - 1)
    assert stats["auto_steps_after_probe"] == {"source": {"steps": after, "dedup": after - 1}}
    # every position is counted; one none step (of 7) sent them all, the others each table's distinct ids
    assert stats["total"]["bags"] == AUTO_STEPS * source["total"]["bags"] / STEPS
    assert stats["total"]["bags"] / AUTO_STEPS < stats["total"]["unique_bags"] < stats["total"]["bags"]


def test_resume_from_a_sharded_checkpoint_continues_the_trajectory(two_ranks):
    full, resumed = two_ranks[0]["none"], two_ranks[0]["resumed"]
    assert [s for s, _ in resumed["losses"]] == list(range(STEPS // 2 + 1, STEPS + 1))
    assert _losses(resumed) == _losses(full)[STEPS // 2:]

