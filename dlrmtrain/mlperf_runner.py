"""MLPerf time-to-train reproduction: N seeded runs per codec, checked and scored.

    dlrmtrain mlperf --config configs/mini_mlperf.yaml \\
        --out runs/mlperf_mini [--codecs none,dedup,auto] [--precisions fp32,bf16]
        [--runs N] [--nproc 2]
        [--link-gbit G [--link-latency-ms L]] [--sim-nodes M] [key=value ...]

For each run index i (seed = run.seed + i) and each codec, in interleaved
order so that drifts in machine load hit both codecs alike, it launches
``dlrmtrain train --nproc P`` (torchrun's launcher, standalone) with the MLPerf
log switched on, copies the log into the MLPerf results layout
(``results/<system>/<benchmark>/result_i.txt`` + ``systems/<system>.json``,
one system per codec), runs the compliance checker on it, and finally scores
each codec as the result summarizer does (olympic mean, one non-converged run
allowed) and prints both scores and their ratio. With ``--precisions fp32,bf16`` each
codec runs under each precision (contender ``dedup@bf16``: dlrmtrain.mlperf.contenders),
interleaved alike, and the ratios to the first codec are printed per precision side by
side, with each codec's fp32 score over its bf16 score. Last, ``dlrmtrain report`` draws
every run (AUC against time, loss, throughput, bytes) into ``<out>/report/``.

With ``--link-gbit`` every run trains behind its own shaped link of that rate
(dlrmtrain.testbed.shaped_link: a private network namespace whose loopback
is one link shared by all ranks and both directions); the system names say so.
With ``--sim-nodes M`` every run spans M simulated nodes of ``--nproc`` ranks
each (dlrmtrain.testbed.sim_nodes: a namespace per node), and the link of
``--link-gbit`` joins the nodes: only traffic between nodes crosses it.

The same command on the same ``--out`` continues the series (dlrmtrain.mlperf.series):
finished runs are skipped untouched, an interrupted one resumes from its checkpoint or
is set aside and started afresh, and another plan is refused before anything starts.
Each launcher stops when the runner dies, even by kill -9 (dlrmtrain.run.parent).

Runs count: MLPerf's (5 for dlrm, 10 for dlrm_dcnv2 and dlrmv4) unless ``--runs``
says otherwise. Rules: derived UNOFFICIAL ones for the config's target and eval
size (dlrmv4: also its train samples, sequence length, warmup, learning rate per
8192 of batch and eval schedule; written under ``<out>/rules/``) unless
``--rules official``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dlrmtrain.comm.labels import parse_contender
from dlrmtrain.testbed import sim_nodes
from dlrmtrain.testbed.options import add_link_options, check_rate_options
from dlrmtrain.testbed.shaped_link import LinkSpec, ShapedLinkUnavailable, require_available, \
    wrap_command

from tqdm import tqdm

from dlrmtrain.mlperf.benchmarks import DLRMV4, display_label
from dlrmtrain.mlperf.contenders import PRECISIONS, expand, mixed_precision_speedups, \
    precision_overrides, ratios_by_precision, split_precision
from dlrmtrain.mlperf.compliance import DEFAULT_RULESET, ComplianceResult, RcpVerdict, check_log, \
    rcp_verdict
from dlrmtrain.mlperf.rules import OFFICIAL_EVAL_SAMPLES, RULESETS, DerivedRulesSpec, Dlrmv4Scale
from dlrmtrain.mlperf.rules.derive import derive_rules_text
from dlrmtrain.mlperf import series
from dlrmtrain.mlperf.scoring import BenchmarkScore, RunTime, olympic_score, required_runs, \
    eval_time_share, run_time_minutes
from dlrmtrain.mlperf.submission import SubmissionLayout, describe_system, \
    write_system_description
from dlrmtrain.run.parent import OWNER_ENV
from dlrmtrain.workloads import workload_of

UNOFFICIAL_NOTE = ("UNOFFICIAL: small-scale reproduction checked with derived rules "
                   "(own target and eval size); not an MLPerf result.")


@dataclass(frozen=True)
class RunnerPlan:
    config: Path
    out: Path
    overrides: tuple[str, ...]
    benchmark: str
    codecs: tuple[str, ...]
    runs: int
    base_seed: int
    nproc: int
    backend: str
    """`gloo` (CPU) or `nccl` (GPU), from the config's run.device."""
    ruleset: str
    rules: Path | None
    """Derived rules file (written once the series is claimed); None: the official rules."""
    timeout_s: float
    link: LinkSpec | None = None
    """Shaped link every run trains behind; None: the machine's own loopback."""
    sim_nodes: int | None = None
    """Simulated nodes of `nproc` ranks each, joined by `link`; None: one node."""
    rules_text: str | None = None
    """The derived rules' YAML (None: official rules)."""
    config_values: dict | None = None
    """The config as loaded with its overrides (what the series' plan records)."""

    def system(self, codec: str) -> str:
        kind = "gpu" if self.backend == "nccl" else "cpu"
        ranks = f"{self.sim_nodes}x{self.nproc}" if self.sim_nodes else f"{self.nproc}"
        link = f"_link-{self.link.gbit:g}gbit" if self.link else ""
        return f"{kind}{ranks}_{self.backend}{link}_codec-{codec.replace('/', '-').replace('@', '_')}"

    @property
    def nodes(self) -> int:
        return self.sim_nodes or 1

    def describe_link(self) -> str:
        if self.sim_nodes:
            return f", {sim_nodes.SimNodes(self.sim_nodes, self.link).describe()}"
        return f", behind a {self.link.describe()}" if self.link else ""

    def layout(self, codec: str) -> SubmissionLayout:
        return SubmissionLayout(self.out, self.system(codec), self.benchmark)


@dataclass(frozen=True)
class CodecOutcome:
    codec: str
    score: BenchmarkScore
    checks: tuple[ComplianceResult, ...]
    rcp: RcpVerdict | None = None
    """The official RCP checker's verdict (official rules only)."""
    eval_share: float | None = None
    """Mean share of a run's wall time spent evaluating."""


class RunnerArgumentError(ValueError):
    """An option the runner cannot honour; found before anything is written (exit 2)."""


class RunnerRunError(RuntimeError):
    """A run that failed or timed out (exit 3); the message says which and where its output is."""


def check_arguments(args: argparse.Namespace, benchmark: str) -> None:
    """Every option that needs no launch, checked before anything is written."""
    if args.runs is not None and args.runs < 1:
        raise RunnerArgumentError(f"--runs must be at least 1, got {args.runs}")
    if args.nproc < 1:
        raise RunnerArgumentError(f"--nproc must be at least 1, got {args.nproc}")
    if not (args.timeout_min > 0 and math.isfinite(args.timeout_min)):
        raise RunnerArgumentError(f"--timeout-min must be a positive number of minutes, "
                                  f"got {args.timeout_min}")
    contenders = args.codecs.split(",")
    repeated = sorted({c for c in contenders if contenders.count(c) > 1})
    if repeated:
        raise RunnerArgumentError(f"--codecs {args.codecs}: {', '.join(repeated)} given more than "
                                  f"once (each contender runs once per seed)")
    known = RULESETS[benchmark] if args.rules == "derived" else official_rulesets(benchmark)
    if args.ruleset is not None and args.ruleset not in known:
        raise RunnerArgumentError(f"--ruleset {args.ruleset}: no {args.rules} {benchmark} rules "
                                  f"for it (known: {', '.join(known)})")


def official_rulesets(benchmark: str) -> list[str]:
    """The training rulesets of the installed checker that hold rules for `benchmark`."""
    from mlperf_logging import compliance_checker

    root = Path(compliance_checker.__file__).parent
    return sorted((d.name.split("_", 1)[1] for d in root.glob("training_*")
                   if (d / f"closed_{benchmark}.yaml").is_file()),
                  key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()))


def plan_from_args(args: argparse.Namespace) -> RunnerPlan:
    from dlrmtrain.config import load_config  # config errors surface before any launch
    from dlrmtrain.validation import validate_config

    cfg = load_config(args.config, list(args.overrides))
    check_arguments(args, workload_of(cfg).benchmark)
    check_series_overrides(cfg)
    try:
        contenders = expand(args.codecs.split(","), args.precisions and args.precisions.split(","))
    except ValueError as e:
        raise SystemExit(str(e)) from None
    for codec in contenders:
        try:
            settings = contender_overrides(codec)
        except ValueError as e:
            raise SystemExit(f"--codecs: {e}") from None
        validate_config(load_config(args.config, [*args.overrides, *settings]),
                        world_size=args.nproc * (args.sim_nodes or 1))
    try:
        check_rate_options(args.link_gbit, args.link_latency_ms, "link-")
    except ValueError as e:
        raise SystemExit(str(e)) from None
    link = None
    if args.link_gbit is not None:
        try:
            link = LinkSpec(args.link_gbit, args.link_latency_ms)
            if args.sim_nodes is None:
                require_available()  # say why not before any launch
        except (ValueError, ShapedLinkUnavailable) as e:
            raise SystemExit(f"--link-gbit: {e}") from None
    if args.sim_nodes is not None:
        try:
            sim_nodes.require_available(sim_nodes.SimNodes(args.sim_nodes, link).nodes)
        except (ValueError, ShapedLinkUnavailable) as e:
            raise SystemExit(f"--sim-nodes: {e}") from None
    benchmark = workload_of(cfg).benchmark
    ruleset = args.ruleset or DEFAULT_RULESET[benchmark]
    out = args.out.resolve()
    rules = rules_text = None
    if args.rules == "derived":
        if cfg.eval.target_auc is None:
            raise SystemExit(f"{args.config}: eval.target_auc must be set for an MLPerf run")
        eval_samples = None
        if benchmark in OFFICIAL_EVAL_SAMPLES:
            eval_samples = args.eval_samples or expected_eval_samples(cfg)
        scale = None
        if benchmark == DLRMV4:
            scale = dlrmv4_scale(cfg, args.train_samples or expected_train_samples(cfg))
        spec = DerivedRulesSpec(benchmark, ruleset, cfg.eval.target_auc, eval_samples, scale)
        rules_text = derive_rules_text(spec)
        rules = out / "rules" / f"training_{spec.ruleset}" / spec.filename()
    from dlrmtrain.config.loader import config_to_dict

    return RunnerPlan(
        config=args.config.resolve(), out=out, overrides=tuple(args.overrides),
        benchmark=benchmark, codecs=contenders,
        runs=required_runs(benchmark) if args.runs is None else args.runs, base_seed=cfg.run.seed, nproc=args.nproc,
        backend="nccl" if _uses_gpu(cfg.run.device) else "gloo",
        ruleset=ruleset, rules=rules, timeout_s=args.timeout_min * 60, link=link,
        sim_nodes=args.sim_nodes, rules_text=rules_text, config_values=config_to_dict(cfg))


def check_series_overrides(cfg) -> None:
    """Keys the runner sets per run itself, or that would mix the runs of a series."""
    if cfg.checkpoint.resume:
        raise RunnerArgumentError("checkpoint.resume: the runner resumes each interrupted run "
                                  "itself; leave it out and re-run the same command")
    if cfg.checkpoint.dir:
        raise RunnerArgumentError(f"checkpoint.dir={cfg.checkpoint.dir}: every run of a series "
                                  f"keeps its checkpoints in its own run folder; leave it unset")


PER_RUN_KEYS = ("run.name", "run.output_dir", "run.seed", "comm.codec", "comm.hierarchy",
                "mlperf.enabled", "logging.progress_bar")
"""Config keys the runner sets for each run itself (run_command): not part of the plan."""


def series_plan(plan: RunnerPlan) -> dict:
    """What `<out>/plan.json` records (series.py): a re-run must match it entry by entry."""
    config = {section: {k: v for k, v in values.items() if f"{section}.{k}" not in PER_RUN_KEYS}
              for section, values in plan.config_values.items()}
    return {"config": config, "codecs": list(plan.codecs),
            "seeds": [plan.base_seed + i for i in range(plan.runs)],
            "ranks": {"nproc": plan.nproc, "sim_nodes": plan.sim_nodes, "backend": plan.backend},
            "link": None if plan.link is None else {"gbit": plan.link.gbit,
                                                     "latency_ms": plan.link.latency_ms},
            "benchmark": plan.benchmark, "ruleset": plan.ruleset,
            "rules": plan.rules_text if plan.rules_text is not None else "official"}


def claim_series(plan: RunnerPlan):
    """Start or continue the series in `plan.out` (series.py); the held lock. Raises
    series.SeriesRefused, having written nothing, for another plan or a run still in use."""
    lock = series.claim(plan.out, series_plan(plan))
    try:  # a run of a killed series may still be stopping
        series.check_not_in_use([run_paths(plan, codec, index)[0] for codec in plan.codecs
                                 for index in range(plan.runs)])
    except series.SeriesRefused:
        lock.release()
        raise
    if plan.rules is not None and not plan.rules.is_file():
        plan.rules.parent.mkdir(parents=True, exist_ok=True)
        series.write_atomically(plan.rules, plan.rules_text)
    return lock


def _uses_gpu(device: str) -> bool:
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device == "cuda"


def expected_eval_samples(cfg) -> int:
    """The eval-set size the config asks for (checked by dlrm_dcnv2's and dlrmv4's rules)."""
    if cfg.data.source == "synthetic":
        return cfg.data.synthetic.num_eval_samples
    if cfg.data.source == "synthetic_yambda":
        return _yambda_generator(cfg).num_eval_samples
    if cfg.data.source == "criteo":
        from dlrmtrain.data.criteo_source import split_parts
        from dlrmtrain.data.splits import total_rows

        return total_rows(split_parts(cfg.data)[1])
    raise SystemExit(f"cannot tell the eval size of data.source={cfg.data.source!r} from the "
                     "config: pass --eval-samples")


def expected_train_samples(cfg) -> int:
    """The train-set size the config asks for (dlrmv4's rules set their eval grid by it)."""
    if cfg.data.source == "synthetic_yambda":
        return _yambda_generator(cfg).num_train_samples
    raise SystemExit(f"cannot tell the train size of data.source={cfg.data.source!r} from the "
                     "config: pass --train-samples (the run prints it: train_samples in its log)")


def _yambda_generator(cfg):
    # Sizes only: calibration re-fits popularity skews, never the sample counts.
    from dlrmtrain.data.yambda.builder import cross_specs, synthetic_profile
    from dlrmtrain.data.yambda.synthetic import YambdaLikeGenerator

    return YambdaLikeGenerator(synthetic_profile(cfg.data), cross_specs(cfg.data))


def dlrmv4_scale(cfg, train_samples: int) -> Dlrmv4Scale:
    """The numbers of a dlrmv4 config that its derived rules hold it to."""
    from dlrmtrain.mlperf.eval_grid import eval_grid_for_config

    try:
        eval_grid_for_config(cfg, train_samples)  # refuses a grid the run never reaches
    except ValueError as e:
        raise SystemExit(f"{e}") from None
    return Dlrmv4Scale(
        train_samples=train_samples, max_sequence_length=cfg.model.hstu.max_seq_len,
        warmup_steps=cfg.optim.warmup_steps,
        reference_lr=cfg.optim.lr * 8192 / cfg.run.global_batch_size,
        eval_every_data_pct=cfg.mlperf.eval_every_data_pct,
        skip_eval_epoch_pct=cfg.mlperf.skip_eval_epoch_pct)


def run_command(plan: RunnerPlan, codec: str, index: int, resume: bool = False) -> list[str]:
    """The command line of one run: `dlrmtrain train` (torchrun in-process), behind the plan's
    link, or on its simulated nodes (`dlrmtrain train` builds them); `resume`: from the
    run's own checkpoint."""
    run_root = plan.out / "runs" / plan.system(codec)
    overrides = [*plan.overrides, f"run.seed={plan.base_seed + index}", *contender_overrides(codec),
                 f"run.output_dir={run_root}", f"run.name={run_name(plan, index)}",
                 "mlperf.enabled=true", "logging.progress_bar=false",
                 *(["checkpoint.resume=true"] if resume else [])]
    ranks = [f"--nproc={plan.nproc}"]
    if plan.sim_nodes is not None:
        ranks.append(f"--sim-nodes={plan.sim_nodes}")
        if plan.link is not None:
            ranks += [f"--link-gbit={plan.link.gbit!r}",
                      f"--link-latency-ms={plan.link.latency_ms!r}"]
    cmd = [sys.executable, "-m", "dlrmtrain", "train", *ranks, "--config", str(plan.config),
           *overrides]
    return cmd if plan.sim_nodes is not None else wrap_command(cmd, plan.link)


def contender_overrides(contender: str) -> list[str]:
    """The config settings of one contender: a codec name, or `<codec>/node` for that
    codec over the two-level all-to-all (`comm.hierarchy: node`), either with `@<precision>`
    (`precision.mode`, from --precisions)."""
    label, _ = split_precision(contender)
    codec, hierarchy = parse_contender(label)
    return ([f"comm.codec={codec}"] + (["comm.hierarchy=node"] if hierarchy == "node" else [])
            + precision_overrides(contender))


def run_name(plan: RunnerPlan, index: int) -> str:
    return f"run{index}_seed{plan.base_seed + index}"


def run_paths(plan: RunnerPlan, codec: str, index: int) -> tuple[Path, Path]:
    """(run folder, console file) of one run."""
    run_root = plan.out / "runs" / plan.system(codec)
    name = run_name(plan, index)
    return run_root / name, run_root / f"{name}.out"


def launch_run(plan: RunnerPlan, codec: str, index: int,
               resume_from: Path | None = None) -> Path:
    """Train once on `plan.nproc` ranks (per node), or resume the run from its checkpoint
    `resume_from` (its console file is appended to); return the run's MLPerf log."""
    seed = plan.base_seed + index
    run_dir, console = run_paths(plan, codec, index)
    cmd = run_command(plan, codec, index, resume=resume_from is not None)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           OWNER_ENV: str(os.getpid())}  # the launcher stops when this runner dies (run/parent.py)
    with open(console, "a" if resume_from is not None else "w") as out:
        if resume_from is not None:
            out.write(f"# dlrmtrain mlperf: resuming this run from {resume_from}\n")
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        returncode = run_bounded(cmd, out, env, plan.timeout_s)
    if returncode is None:
        raise RunnerRunError(f"run {index} ({codec}, seed {seed}) did not finish within "
                             f"--timeout-min {plan.timeout_s / 60:g}; stopped it and its ranks; "
                             f"output in {console}")
    if returncode != 0:
        tail = "\n".join(console.read_text().splitlines()[-25:])
        raise RunnerRunError(f"run {index} ({codec}, seed {seed}) exited with {returncode}; "
                             f"output in {console}:\n{tail}")
    return run_dir / "mlperf.log"


STOP_GRACE_S = 30.0
"""Seconds a timed-out run gets to stop at a step boundary before it is killed."""


def run_bounded(cmd: list[str], out, env: dict[str, str], timeout_s: float) -> int | None:
    """Run `cmd` in a session (process group) of its own; its exit code, or None when
    it outlived `timeout_s` and was stopped (end_group). A Ctrl-C of the runner, which
    no longer reaches that group from the terminal, is passed on the same way."""
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        end_group(proc, signal.SIGTERM)
        return None
    except KeyboardInterrupt:
        end_group(proc, signal.SIGINT)
        raise


def end_group(proc: subprocess.Popen, first: signal.Signals) -> None:
    """`first` to the whole group (the launcher forwards it to its ranks, which stop at a
    step boundary), SIGKILL after `STOP_GRACE_S` (ranks whose launcher dies stop by
    themselves: dlrmtrain.run.parent)."""
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the group is gone already
            return
        try:
            proc.wait(timeout=STOP_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def execute(plan: RunnerPlan) -> list[CodecOutcome]:
    notes = UNOFFICIAL_NOTE if plan.rules else ""
    for codec in plan.codecs:
        layout = plan.layout(codec)
        layout.result_dir.mkdir(parents=True, exist_ok=True)
        description = describe_system(layout.system, submitter="dlrmtrain", division="closed",
                                      nodes=plan.nodes, processes_per_node=plan.nproc,
                                      backend=plan.backend,
                                      codec=codec, notes=notes)
        if not layout.system_json.is_file():  # a continued series keeps its own
            write_system_description(layout, description, plan.ruleset)
    checks: dict[str, list[ComplianceResult]] = {c: [] for c in plan.codecs}
    bar = tqdm(total=plan.runs * len(plan.codecs), desc="MLPerf runs", unit="run")
    for index in range(plan.runs):
        # interleaved, and which codec goes first alternates: load drifts hit both alike
        for codec in (plan.codecs if index % 2 == 0 else plan.codecs[::-1]):
            bar.set_postfix(codec=codec, seed=plan.base_seed + index)
            result = plan.layout(codec).result_file(index)
            state = series.prepare_run(result, *run_paths(plan, codec, index))
            if state.set_aside is not None:
                tqdm.write(f"[{codec}] run {index}: interrupted earlier without a checkpoint; "
                           f"set aside as {state.set_aside}, starting it afresh")
            if not state.finished:
                try:
                    log = launch_run(plan, codec, index, state.resume_from)
                except RunnerRunError:
                    bar.close()  # the error is printed on a line of its own
                    raise
                series.copy_atomically(log, result)  # its presence says: finished
            check = check_log(result, plan.ruleset, plan.rules)
            checks[codec].append(check)
            took = "-"
            if check.passed:  # a failed log may lack run_stop
                minutes = run_time_minutes(result, plan.ruleset)
                took = f"{minutes:.3f} min ({minutes * 60:.1f} s)"
            earlier = " (finished earlier, kept as it was)" if state.finished else ""
            tqdm.write(f"[{codec}] {check.summary()}; time to train {took}{earlier}")
            bar.update(1)
    bar.close()
    outcomes = []
    for codec in plan.codecs:
        runs = [RunTime(c.log_path.name, run_time_minutes(c.log_path, plan.ruleset)
                        if c.passed else None) for c in checks[codec]]
        outcomes.append(CodecOutcome(codec, olympic_score(plan.benchmark, runs),
                                     tuple(checks[codec]), *_convergence(plan, codec, checks[codec])))
    return outcomes


def _convergence(plan: RunnerPlan, codec: str, checks: list[ComplianceResult]
                 ) -> tuple[RcpVerdict | None, float | None]:
    """The RCP verdict (official rules: derived ones move the target off the RCPs') and the
    mean eval share of the runs that reached run_stop."""
    rcp = (rcp_verdict(plan.layout(codec).result_dir, plan.benchmark, plan.ruleset)
           if plan.rules is None else None)
    shares = [s for s in (eval_time_share(c.log_path, plan.ruleset) for c in checks)
              if s is not None]
    return rcp, (sum(shares) / len(shares) if shares else None)


def render_summary(plan: RunnerPlan, outcomes: list[CodecOutcome]) -> str:
    rules = f"UNOFFICIAL derived rules {plan.rules}" if plan.rules else "official rules"
    lines = ["=" * 72, f"MLPerf time to train: {plan.benchmark}, ruleset {plan.ruleset}, {rules}",
             f"  {plan.runs} seeded runs per codec on {plan.nodes * plan.nproc} {plan.backend} "
             f"ranks{plan.describe_link()}; results in "
             f"{plan.out / 'results'}"]
    for o in outcomes:
        times = ", ".join("not converged" if r.minutes is None else f"{r.minutes:.3f}"
                          for r in o.score.runs)
        lines += [f"  codec {display_label(plan.benchmark, o.codec):<6} {o.score.summary()}",
                  f"    run times (min): {times}"]
        if o.eval_share is not None:
            lines.append(f"    evaluation: {o.eval_share:.1%} of the wall time (mean over runs)")
        if o.rcp is not None:
            lines.append(f"    {o.rcp.line()}")
        lines += [f"    {line}" for line in auto_choices(plan, o.codec)]
    lines += _ratio_lines(outcomes)
    if outcomes and outcomes[0].checks:
        lines.append(f"  check one yourself: {outcomes[0].checks[0].command}")
    lines.append("=" * 72)
    return "\n".join(lines)


def auto_choices(plan: RunnerPlan, codec: str) -> list[str]:
    """Per run of an `auto` contender, one line: what auto chose and when (report.auto_line_of);
    none for other codecs."""
    from dlrmtrain.report import auto_line_of

    if parse_contender(split_precision(codec)[0])[0] != "auto":
        return []
    return [f"auto, seed {plan.base_seed + index}: {auto_line_of(run_paths(plan, codec, index)[0])}"
            for index in range(plan.runs)]


def _ratio_lines(outcomes: list[CodecOutcome]) -> list[str]:
    """Each codec's ratio to the first; under several precisions, a column per precision (the
    ratio to that precision's first codec) and each codec's fp32 score over its bf16 score."""
    scores = {o.codec: o.score.minutes for o in outcomes}
    by_precision = ratios_by_precision(scores)
    if None in by_precision or len(by_precision) == 1:
        first = outcomes[0].codec if outcomes else None
        return [f"  ratio {first} / {other} = {ratio:.3f} "
                f"({'>1: ' + other + ' is faster' if ratio > 1 else '<=1: no gain from ' + other})"
                for other, ratio in ratios_to_first(outcomes).items()]
    precisions = [p for p in PRECISIONS if p in by_precision]
    codecs = list(dict.fromkeys(split_precision(o.codec)[0] for o in outcomes))
    lines = [f"  time to train, {codecs[0]} / codec (>1: the codec is faster), per precision:",
             "    " + f"{'codec':<12}" + "".join(f"{p:>9}" for p in precisions)]
    for codec in codecs[1:]:
        cells = (by_precision[p].get(codec) for p in precisions)
        lines.append("    " + f"{codec:<12}" + "".join(
            f"{'-' if r is None else f'{r:.3f}':>9}" for r in cells))
    amp = mixed_precision_speedups(scores)
    if amp:
        lines.append("  fp32 / bf16 time to train per codec (>1: bf16 is faster): "
                     + ", ".join(f"{c} {r:.3f}" for c, r in amp.items()))
    return lines


def speedup(outcomes: list[CodecOutcome]) -> float | None:
    """Score of the first codec over the second's (None unless both scored)."""
    if len(outcomes) < 2:
        return None
    return ratios_to_first(outcomes[:2]).get(outcomes[1].codec)


def ratios_to_first(outcomes: list[CodecOutcome]) -> dict[str, float]:
    """Score of the first codec (the baseline, e.g. none) over each other scored codec's."""
    if not outcomes or outcomes[0].score.minutes is None:
        return {}
    base = outcomes[0].score.minutes
    return {o.codec: base / o.score.minutes for o in outcomes[1:] if o.score.minutes is not None}


def write_summary(plan: RunnerPlan, outcomes: list[CodecOutcome]) -> Path:
    payload = {
        "benchmark": plan.benchmark, "ruleset": plan.ruleset,
        "rules": str(plan.rules) if plan.rules else "official", "unofficial": plan.rules is not None,
        "config": str(plan.config), "overrides": list(plan.overrides), "runs": plan.runs,
        "nproc": plan.nproc, "sim_nodes": plan.sim_nodes,
        "link": None if plan.link is None else {"gbit": plan.link.gbit,
                                                 "latency_ms": plan.link.latency_ms},
        "codecs": {o.codec: {
            "score_minutes": o.score.minutes, "non_converged": o.score.non_converged,
            "run_minutes": [r.minutes for r in o.score.runs],
            "failed_rules": [sorted(str(k) for k in c.failed_keys) for c in o.checks],
            "eval_share": o.eval_share,
            "auto_choices": auto_choices(plan, o.codec),
            "rcp": None if o.rcp is None else {"passed": o.rcp.passed, "message": o.rcp.message,
                                               "norm_factor": o.rcp.norm_factor},
        } for o in outcomes},
        "ratio_first_over_second": speedup(outcomes),
        "ratios_to_first": ratios_to_first(outcomes),
        "ratios_by_precision": {str(p): r for p, r in ratios_by_precision(
            {o.codec: o.score.minutes for o in outcomes}).items()},
        "fp32_over_bf16": mixed_precision_speedups({o.codec: o.score.minutes for o in outcomes}),
    }
    path = plan.out / "summary.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dlrmtrain mlperf", description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True, help="run config (YAML)")
    p.add_argument("--out", type=Path, required=True, help="submission tree to write")
    p.add_argument("--codecs", default="none,dedup,auto",
                   help="comma-separated, the first is the baseline of the ratios; "
                        "<codec>/node: that codec over two levels (comm.hierarchy=node) "
                        "(default: none,dedup,auto)")
    p.add_argument("--precisions", default=None,
                   help="comma-separated precision.mode values (fp32,bf16): every codec runs "
                        "under each, contender <codec>@<precision> (default: the config's)")
    p.add_argument("--runs", type=int, default=None, help="runs per codec (default: MLPerf's)")
    p.add_argument("--nproc", type=int, default=2, help="ranks per run (default: 2)")
    p.add_argument("--ruleset", default=None,
                   help="default: 2.1.0 (dlrm), 6.0.0 (dlrm_dcnv2), 6.1.0 (dlrmv4)")
    p.add_argument("--rules", choices=("derived", "official"), default="derived")
    p.add_argument("--eval-samples", type=int, default=None,
                   help="eval size for dlrm_dcnv2's and dlrmv4's derived rules "
                        "(default: from the config)")
    p.add_argument("--train-samples", type=int, default=None,
                   help="train size for dlrmv4's derived rules (default: from the config; "
                        "needed for data.source yambda)")
    p.add_argument("--timeout-min", type=float, default=60.0, help="per run (default: 60)")
    add_link_options(p)
    p.add_argument("overrides", nargs="*", help="config overrides, section.key=value")
    return p.parse_args(argv)


def report_runs(plan: RunnerPlan) -> None:
    """Plots of every run into <out>/report (a failure here loses no result)."""
    from dlrmtrain.report import ReportError, write_report

    run_dirs = sorted(d for codec in plan.codecs for index in range(plan.runs)
                      if (d := run_paths(plan, codec, index)[0]).is_dir())  # not those set aside
    try:
        written = write_report(run_dirs, plan.out / "report")
    except (ReportError, OSError) as e:
        print(f"report: not written ({e}); the results above are complete", file=sys.stderr)
        return
    print(f"report: {written[-1]} ({len(written) - 1} plots)")


def main(argv: list[str] | None = None) -> int:
    from dlrmtrain.config import ConfigError

    try:
        plan = plan_from_args(parse_args(argv))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except RunnerArgumentError as e:
        print(f"dlrmtrain mlperf: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # the other refusals of plan_from_args: one line too, exit 2
        if not isinstance(e.code, str):
            raise
        print(f"dlrmtrain mlperf: {e.code}", file=sys.stderr)
        return 2

    try:
        lock = claim_series(plan)
    except series.SeriesRefused as e:
        print(f"dlrmtrain mlperf: {e}", file=sys.stderr)
        return 2
    try:
        return run_series(plan)
    finally:
        lock.release()


def run_series(plan: RunnerPlan) -> int:
    started = time.perf_counter()
    try:
        outcomes = execute(plan)
    except RunnerRunError as e:
        print(f"dlrmtrain mlperf: {e}", file=sys.stderr)
        return 3
    print(render_summary(plan, outcomes))
    report_runs(plan)
    print(f"summary: {write_summary(plan, outcomes)}  "
          f"(wall {(time.perf_counter() - started) / 60:.1f} min)")
    return 0 if all(o.score.minutes is not None for o in outcomes) else 1

if __name__ == "__main__":
    sys.exit(main())
