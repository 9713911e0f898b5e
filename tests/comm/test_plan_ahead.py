"""Planning at the pipeline's input stage (issue 19 item 3), in one 2-rank launch: the trainer
under `dedup` with table-, column- and row-wise tables, the plain loop, then `run.pipeline=true`,
an eval every 2 steps (it detaches the pipelined model; the plans move over on re-attach).

- the plans made ahead (while the previous step runs) are the plans the plain loop makes in
  its steps, bitwise, and the losses are bitwise the plain loop's;
- pipelined steps make no codec host sync on the critical path (HostSyncCounter; only the first
  step, which fills the pipeline, plans in its forward), one per dist ahead instead, and the
  comm stats count the same;
- bytes are counted once per pass run: the plan made ahead for the batch after the last
  step (never run) counts nothing.

`auto` in the same launch (issue 27), its policy set so that it decides at step 4, the same
way in both loops: dedup for the table- and column-wise all-to-alls (settled on dedup), none
for the row-wise one. From the decision on, a pipelined step makes no codec host sync (its
dedup dists plan the next pass ahead, as `dedup`'s do); the plan made ahead for the row-wise
pass that took none is dropped, its counters never added and never left in a context the
stock dist runs; the losses are bitwise the plain loop's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.common import tiny_config
from tests.multiproc import run_ranks

STEPS = 3
SHARDING = "sharding.tables={t_cat_2: row_wise, t_cat_9: row_wise, t_cat_15: column_wise}"
AUTO_STEPS = 8  # decided at step 4 (below), an eval after it (detach, re-attach), 4 steps settled
AUTO_DECIDES_AT = 4
AUTO_SET = {"probe_steps": 3, "check_every": 7, "table_keep_fraction": 0.5}
"""comm.auto overrides the run's auto dists must be built with (before forced_policy replaces them)"""


def forced_policy(choice: str):
    """An `AutoPolicy` that decides `choice` at step `AUTO_DECIDES_AT` whatever the clock says
    (one warm-up step, one timed step per path, no early end, no table left uncompressed)."""
    from dlrmtrain.comm.auto.policy import AutoPolicy

    return AutoPolicy(warmup_steps=1, probe_steps=1, min_probe_steps=1,
                      margin=-100.0 if choice == "dedup" else 100.0, close_call_retimes=0, table_keep_fraction=2.0)


def _record_plans(planner, model, log: dict) -> None:
    """Keep every plan `planner` makes (a pure function of the ids), training's and eval's apart."""
    make = planner.plan

    def plan(step):
        made = make(step)
        log["train" if model.training else "eval"].append(
            None if made is None else {f.name: getattr(made, f.name) for f in dataclasses.fields(made)})
        return made
    planner.plan = plan


def syncs_per_call(step_fn, syncs: list):
    """`step_fn` run under a HostSyncCounter; each call's (critical-path, ahead) syncs appended to `syncs`."""
    from tests.comm.sync_counter import HostSyncCounter

    def counted(*args):
        counter = HostSyncCounter()
        with counter:
            out = step_fn(*args)
        syncs.append(([name for name, _ in counter.syncs], [name for name, _ in counter.ahead]))
        return out
    return counted


def _split_exchanges(step_fn, per_step: list):
    """`step_fn` with TorchRec's KJT split all-to-alls (`SplitsAllToAllAwaitable`'s) it launches
    counted, one entry per call appended to `per_step` (the real collective runs)."""
    import sys

    import torch.distributed as dist
    from torchrec.distributed.dist_data import SplitsAllToAllAwaitable

    def counted(*args):
        launch, calls = dist.all_to_all_single, [0]

        def all_to_all_single(*a, **kw):
            calls[0] += isinstance(sys._getframe(1).f_locals.get("self"), SplitsAllToAllAwaitable)
            return launch(*a, **kw)
        dist.all_to_all_single = all_to_all_single
        try:
            return step_fn(*args)
        finally:
            dist.all_to_all_single = launch
            per_step.append(calls[0])
    return counted


def _trainer(env, world_size: int, out_dir: str, mode: str, *overrides: str):
    """The trainer on the tiny config, `mode` "plain" or "pipelined" (run.pipeline=true)."""
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config, validate_config

    cfg = resolve_config(tiny_config(out_dir, SHARDING, f"run.pipeline={mode == 'pipelined'}",
                                     "data.synthetic.num_eval_samples=512", *overrides))
    validate_config(cfg, world_size)
    return Trainer(cfg, env)


def _wrap_steps(trainer, wrap) -> None:
    """Wrap what each training step runs: the pipeline's `progress`, else `train_step`."""
    if trainer.pipeline is not None:
        trainer.pipeline.progress = wrap(trainer.pipeline.progress)
    else:
        trainer.train_step = wrap(trainer.train_step)


def _auto_plain_then_pipelined(env, world_size: int, out_dir: str) -> dict:
    """`auto` under the plain loop, then the pipeline (see the module's docstring)."""
    from dlrmtrain.comm.auto.dist import AutoDist
    from dlrmtrain.comm.stats import collect_comm_stats
    from dlrmtrain.comm.torchrec.contexts import PLAN_AHEAD

    results = {}
    for mode in ("plain", "pipelined"):
        trainer = _trainer(env, world_size, out_dir, mode, "comm.codec=auto", "comm.dedup_at=owner", f"run.max_steps={AUTO_STEPS}",
                           "eval.evals_per_epoch=4", f"run.name=auto_{mode}",
                           *(f"comm.auto.{k}={v}" for k, v in AUTO_SET.items()))
        dists = trainer.comm_counters.of_type(AutoDist)
        built_with = {d.sharding_type: {k: getattr(d.policy, k) for k in AUTO_SET} for d in dists}
        stale = []  # per training pass the stock dist ran: a plan still in its context?

        def look_for_a_plan(_module, args, kwargs) -> None:
            if trainer.model.training:
                ctx = args[1] if len(args) > 1 else kwargs.get("sharding_ctx")
                stale.append(getattr(ctx, PLAN_AHEAD, None) is not None)
        for d in dists:
            d.policy = forced_policy("none" if d.sharding_type == "row_wise" else "dedup")
            d.stock_dist.register_forward_pre_hook(look_for_a_plan, with_kwargs=True)
        syncs: list = []
        _wrap_steps(trainer, lambda step_fn: syncs_per_call(step_fn, syncs))
        summary = trainer.train()
        stats = collect_comm_stats(trainer.comm_counters)
        results[mode] = {
            "losses": summary.losses, "syncs": syncs, "stale": stale,
            "dists": {d.sharding_type: {
                "decisions": [(x.step, x.choice) for x in d.policy.decisions],
                "planned_ahead": d.dedup_dist.comm_stats.planned_ahead,
                "tables": {t: (c.bags, c.unique_bags, c.payload_fwd_sent_bytes, c.payload_fwd_recv_bytes)
                           for t, c in d.comm_stats.tables.items()}} for d in dists},
            "stats": {k: stats[k] for k in ("steps", "total")}, "built_with": built_with}
        trainer.close()
        del trainer, dists
    return results


def _plain_then_pipelined(rank: int, world_size: int, out_dir: str) -> dict:
    from dlrmtrain.comm.dedup.dist import DedupDist
    from dlrmtrain.comm.stats import collect_comm_stats
    from dlrmtrain.distributed.env import init_distributed
    from tests.comm.ranks import to_numpy

    env = init_distributed("cpu")
    results = {}
    for mode in ("plain", "pipelined"):
        trainer = _trainer(env, world_size, out_dir, mode, "comm.codec=dedup", "comm.dedup_at=owner", f"run.max_steps={STEPS}",
                           "eval.evals_per_epoch=8", f"run.name={mode}")
        dists = trainer.comm_counters.of_type(DedupDist)
        plans = [{"train": [], "eval": []} for _ in dists]
        for d, log in zip(dists, plans):
            _record_plans(d.planner, trainer.model, log)
        syncs: list = []
        splits: list = []
        _wrap_steps(trainer, lambda step_fn: _split_exchanges(syncs_per_call(step_fn, syncs), splits))
        summary = trainer.train()
        stats = collect_comm_stats(trainer.comm_counters)
        results[mode] = to_numpy({
            "losses": summary.losses, "plans": plans, "syncs": syncs, "dists": len(dists), "splits": splits,
            "sharding_types": sorted(d.comm_stats.sharding_type for d in dists),
            "stats": {k: stats[k] for k in ("steps", "host_syncs_per_step", "planned_ahead_steps", "total")}})
        trainer.close()
        del trainer, dists
    results["auto"] = to_numpy(_auto_plain_then_pipelined(env, world_size, out_dir))
    return results


@pytest.mark.timeout(300)
def test_plans_made_ahead_equal_the_steps_and_leave_no_host_sync_on_the_critical_path(tmp_path):
    for res in run_ranks(_plain_then_pipelined, 2, str(tmp_path), timeout=280):
        _check_auto(res["auto"])
        plain, piped = res["plain"], res["pipelined"]
        dists = plain["dists"]
        assert plain["sharding_types"] == ["column_wise", "row_wise", "table_wise"]

        # the same training, bitwise
        assert [s for s, _ in piped["losses"]] == list(range(1, STEPS + 1))
        assert piped["losses"] == plain["losses"]

        # the plans: made in the plain loop's steps, made ahead in the pipeline's (one more: the
        # batch after the last step); eval batches plan in their forward in both; all bitwise equal
        for made_in_step, made_ahead in zip(plain["plans"], piped["plans"]):
            assert len(made_in_step["train"]) == STEPS and len(made_ahead["train"]) == STEPS + 1
            made_ahead["train"].pop()
            assert len(made_in_step["eval"]) == len(made_ahead["eval"]) > 0
            for a, b in zip(made_in_step["train"] + made_in_step["eval"],
                            made_ahead["train"] + made_ahead["eval"]):
                assert a.keys() == b.keys()
                for key in a:
                    if isinstance(a[key], np.ndarray):
                        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
                    else:
                        assert a[key] == b[key], key

        # host syncs: the plain loop's one per dist per step; the pipeline's only in the step
        # that fills it, then none on the critical path (also after each eval, which detaches
        # the model), one per dist ahead for the next batch
        assert plain["syncs"] == [(["tolist"] * dists, [])] * STEPS
        assert piped["syncs"] == ([(["tolist"] * dists, ["tolist"] * dists)]
                                  + [([], ["tolist"] * dists)] * (STEPS - 1))
        # the comm stats say the same; their passes include the eval batches (planned in-step)
        passes = plain["stats"]["steps"]
        evals = passes - STEPS
        assert evals > 0 and piped["stats"]["steps"] == passes
        assert plain["stats"]["host_syncs_per_step"] == dists
        assert plain["stats"]["planned_ahead_steps"] == 0
        assert piped["stats"]["host_syncs_per_step"] == dists * (1 + evals) / passes
        assert piped["stats"]["planned_ahead_steps"] == STEPS - 1
        # bytes counted per pass run, wherever its plan was made
        assert piped["stats"]["total"] == plain["stats"]["total"]
        # TorchRec's pipeline sees the KJT all-to-alls behind the recording input dists and fuses
        # their split exchanges: one per step for the three shardings (the plain loop: one each).
        # Steps 1 and 3 (after the eval that detached the model) attach the pipeline, which runs
        # their batch's input dist before it takes over the dists' forwards: one per sharding more
        assert plain["splits"] == [dists] * STEPS
        assert piped["splits"] == [dists + 1, 1, dists + 1]


def _check_auto(runs: dict) -> None:
    """`auto` settled on dedup plans ahead as `dedup` does (the module's docstring)."""
    plain, piped = runs["plain"], runs["pipelined"]
    assert [s for s, _ in piped["losses"]] == list(range(1, AUTO_STEPS + 1))
    assert piped["losses"] == plain["losses"]  # bitwise
    decided = {"table_wise": "dedup", "column_wise": "dedup", "row_wise": "none"}
    for run in (plain, piped):  # the config's comm.auto reached every dist the trainer built
        assert run["built_with"] == {kind: AUTO_SET for kind in decided}, run["built_with"]
        for kind, d in run["dists"].items():
            assert d["decisions"] == [(AUTO_DECIDES_AT - 1, decided[kind])], (kind, d["decisions"])
    # the pipeline's steps: the first plans in its forward (it fills the pipeline); step 2 has
    # its plans made ahead; step 3 takes none (nothing planned for it); step 4 may decide either
    # way (planned for, the row-wise plan then dropped) and agrees its decision (auto's own
    # all-reduce, read on the host); from step 5 on, settled: no codec host sync on the critical
    # path, one per dedup dist ahead (the row-wise one runs the stock dist, auto out of the way)
    dists, coded = len(decided), 2
    syncs = piped["syncs"]
    assert syncs[0] == (["tolist"] * dists, ["tolist"] * dists)
    assert syncs[1] == ([], [])
    # (step 3's only ones: TorchRec's stock dist building its split tensors, as under codec none;
    # counted because auto's none path calls it)
    assert set(syncs[2][0]) == {"tensor"} and syncs[2][1] == ["tolist"] * dists
    assert sorted(syncs[3][0]) == ["tensor"] * dists + ["tolist"] * dists  # the decision's agreement
    assert syncs[3][1] == ["tolist"] * coded
    assert syncs[AUTO_DECIDES_AT:] == [([], ["tolist"] * coded)] * (AUTO_STEPS - AUTO_DECIDES_AT)
    # plans made ahead and used: steps 2, 4 and 5-8 (dedup dists), step 2 only (row-wise)
    planned = {k: d["planned_ahead"] for k, d in piped["dists"].items()}
    assert planned == {"table_wise": 6, "column_wise": 6, "row_wise": 1}
    assert all(d["planned_ahead"] == 0 for d in plain["dists"].values())
    # what was not used left nothing behind: counters as the plain loop's, no plan in a none pass
    for kind in decided:
        assert piped["dists"][kind]["tables"] == plain["dists"][kind]["tables"], kind
    assert piped["stats"] == plain["stats"]
    assert piped["stale"] and not any(piped["stale"])


def test_a_plans_counters_add_to_the_dists():
    """What `DedupDist` does with a plan made ahead when its pass runs: every counter adds up,
    what describes the dist stays."""
    from dlrmtrain.comm.stats import DistCommStats

    mine = DistCommStats(codec="dedup", sharding_type="row_wise", table_codecs={"a": "dedup"}, steps=2,
                         codec_seconds=0.5, step_host_syncs=2, planned_ahead=1, messages=3)
    mine.table("a").add_rows(8, 4, 4, sent=3, received=2, bags=5)
    plan = DistCommStats(codec="dedup", sharding_type="row_wise", extra_syncs=1, messages=2)
    plan.table("a").add_rows(8, 4, 4, sent=1, received=1, bags=5)
    plan.table("b").add_rows(4, 4, 4, received=2, bags=2)
    mine.add(plan)
    assert (mine.codec, mine.sharding_type, mine.table_codecs) == ("dedup", "row_wise", {"a": "dedup"})
    assert (mine.steps, mine.codec_seconds, mine.step_host_syncs, mine.planned_ahead) == (2, 0.5, 2, 1)
    assert (mine.extra_syncs, mine.messages) == (1, 5)
    assert (mine.tables["a"].bags, mine.tables["a"].unique_bags) == (10, 3)
    assert mine.tables["a"].payload_fwd_sent_bytes == (3 + 1) * 8 * 4
    assert mine.tables["b"].payload_fwd_recv_bytes == 2 * 4 * 4
