"""The Trainer: builds data, sharded model and optimizer; runs train / evaluate.

Reads top to bottom as the architecture: config → data → model → sharding
(+ codecs) → optimizer and schedule → train loop → records.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Iterator

import torch
import torch.distributed as dist
from tqdm import tqdm

from dlrmtrain.comm.placement import Placement
from dlrmtrain.comm.stats import collect_comm_stats
from dlrmtrain.config.schema import Config
from dlrmtrain.data.loader import pins_for
from dlrmtrain.distributed.env import DistEnv, mean_over_ranks
from dlrmtrain.distributed.planner import summarize_plan
from dlrmtrain.metrics.auc import evaluate_auc
from dlrmtrain.metrics.step_breakdown import NoStepBreakdown, StepBreakdown
from dlrmtrain.mlperf.logger import log_run_setup, mlperf_eval_grid, open_mlperf_logger
from dlrmtrain.optim.lr_schedule import MLPerfLRSchedule
from dlrmtrain.optim.optimizers import build_optimizer
from dlrmtrain.precision import autocast
from dlrmtrain.run.cadence import Cadence
from dlrmtrain.run.checkpoint import TrainerPosition
from dlrmtrain.run.console import comm_summary, plan_summary
from dlrmtrain.run.errors import DataError, SetupError, data_errors
from dlrmtrain.run.lifecycle import RunLifecycle
from dlrmtrain.run.progress import EvalResult, RunProgress, Summary
from dlrmtrain.train_pipeline import build_train_pipeline
from dlrmtrain.validation import unresolved_keys
from dlrmtrain.workloads import build_datasets, build_sharded_model, workload_of


class Trainer:
    def __init__(self, cfg: Config, env: DistEnv) -> None:
        """`cfg` is resolved (validation.resolve_config) and validated."""
        missing = unresolved_keys(cfg) + (["run.pipeline"] if cfg.run.pipeline == "auto" else [])
        if missing:
            raise ValueError(f"Trainer needs a resolved config (validation.resolve_config): "
                             f"{', '.join(missing)} still to resolve")
        self.cfg = cfg
        self.env = env
        benchmark = workload_of(cfg).benchmark
        # the run's directory, records, checkpoints and how it stops (run/lifecycle.py)
        self.lifecycle = RunLifecycle(cfg, env.rank, env.world_size,
                                      partial(open_mlperf_logger, cfg, benchmark))
        self.lifecycle.start()  # rank 0 claims the run directory, locked for the run's life
        try:
            self._build(benchmark)
        except BaseException as e:  # noqa: BLE001 - re-raised, as the agreed error where it is one
            failure = self.lifecycle.abort_start(e)
            if failure is e:
                raise
            raise failure from None

    def _build(self, benchmark: str) -> None:
        # Everything that can refuse the run comes before anything is written: which
        # checkpoint to resume, whether the data fills a step, whether the model fits.
        cfg, env, life = self.cfg, self.env, self.lifecycle
        resume_from = life.open_checkpoints()
        with data_errors(SetupError):
            self.data = build_datasets(cfg, env.rank, env.world_size, pin_memory=pins_for(env.device))
        self.cadence = Cadence.of_epochs(cfg, self.data.steps_per_epoch, self.data.num_train_samples,
                                         env.world_size)
        life.refuse_what_cannot_resume(resume_from, self.cadence.planned_steps())
        workload_of(cfg).check_memory(cfg, self.data.table_rows, env.world_size, env.device)
        self.cadence.eval_grid = mlperf_eval_grid(cfg, benchmark, self.data.num_train_samples)
        self.records, self.mlperf = life.open_records()
        self.mlperf.cache_clear()
        self.mlperf.init_start()
        # where the codec runs (comm/placement.py): its sharder, the loader's batch transform
        self.placement = Placement(cfg.comm, workload_of(cfg).collection_kind)
        self.model, self.plan_text, self.comm_counters = build_sharded_model(
            cfg, self.data.table_rows, env.device, env.world_size, self.placement)
        self.source_auto = self.placement.feed(self.model, self.data, env.device)
        self.optimizer = build_optimizer(self.model, cfg.optim)
        o = cfg.optim
        self.schedule = MLPerfLRSchedule(o.lr, o.warmup_steps, o.decay_start_step,
                                         o.decay_steps, o.end_lr)
        self.step = 0           # optimizer steps taken
        self.epoch = 0          # current pass over the training data
        self.step_in_epoch = 0  # batches of this epoch already trained on
        self.timer = (StepBreakdown(env.device) if cfg.logging.step_breakdown
                      else NoStepBreakdown())
        self.pipeline = build_train_pipeline(cfg.run.pipeline, self.model, self.optimizer,
                                             env.device, self._autocast_forward, self.timer)
        plan_path = self.records.write_text("plan.txt", self.plan_text + "\n")
        rows = self.data.table_rows
        self._print(plan_summary(f"sharding plan ({cfg.sharding.planner}, {len(rows)} tables)",
                                 summarize_plan(self.model.plan, rows, cfg.model.embedding_dim),
                                 str(plan_path) if plan_path else None))
        self._resume(resume_from)
        if cfg.mlperf.enabled:  # dlrmv4's setup reads its eval grid: only where MLPerf asks
            log_run_setup(self.mlperf, cfg, self.data.num_train_samples,
                          self.data.num_eval_samples)
            self.mlperf.init_stop()

    def _print(self, text: str) -> None:
        if self.env.is_main:
            tqdm.write(text)

    # ---- one step ---------------------------------------------------------
    def _autocast(self):
        return autocast(self.cfg.precision.mode, self.env.device,
                        workload_of(self.cfg).model_scopes_its_own_autocast)

    def _autocast_forward(self, batch):
        with self._autocast():
            return self.model(batch)

    def _batches(self, epoch: int, skip: int):
        """This rank's training batches of `epoch` on the device, from batch `skip` on,
        timed as the `data` phase."""
        it = iter(self.data.train_batches(epoch, skip))
        while True:
            self.timer.step_begins(self.step + 1)
            with self.timer.phase("data"), data_errors(DataError):
                with self.timer.waiting_for_input():  # the loader's workers not ahead of the step
                    batch = next(it, None)
                if batch is not None:
                    batch = batch.to(self.env.device, non_blocking=True)
            if batch is None:
                return
            yield batch if self.source_auto is None else self.source_auto.pick(batch)

    def train_on(self, batches) -> Iterator[torch.Tensor]:
        """Train on `batches` (on the device) through run.pipeline's pipeline (train_pipeline.py),
        yielding each step's local loss, detached; it drains the batches in flight at their end."""
        it = iter(batches)
        while True:
            self.schedule.apply(self.step + 1, [self.optimizer])  # before its zero_grad
            try:
                loss, _, _ = self.pipeline.progress(it)
            except StopIteration:
                return
            self.step += 1
            if self.source_auto is not None:
                self.source_auto.step_ended()
            self.timer.step_ends()
            yield loss.detach()

    def _steps(self) -> Iterator[torch.Tensor]:
        """Run steps across epochs, forever; yields each step's local loss."""
        while True:
            self.mlperf.epoch_start(self.epoch, samples_count=self._samples_trained())
            batches = self._batches(self.epoch, skip=self.step_in_epoch)
            for loss in self.train_on(batches):
                self.step_in_epoch += 1
                yield loss
            self.mlperf.epoch_stop(self.epoch, samples_count=self._samples_trained())
            self.epoch += 1
            self.step_in_epoch = 0

    # ---- evaluation -------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> tuple[float, int]:
        """Exact AUC over the whole eval set (every rank gets the same value); a SIGTERM
        does not wait for the whole evaluation (RunLifecycle.during_eval)."""
        batches = data_errors(DataError).wrap(self.data.eval_batches())
        if self.source_auto is not None:  # the current choice's form
            batches = ((self.source_auto.pick_for_eval(b), w) for b, w in batches)
        return evaluate_auc(self.pipeline.detach(), batches, self.env.device, self._autocast,
                            before_batch=lambda: self.lifecycle.during_eval(self.step))

    # ---- checkpoints ------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Save this step's checkpoint (RunLifecycle.save_checkpoint: what a failed save or a
        stop signal during it does)."""
        position = TrainerPosition(step=self.step, epoch=self.epoch,
                                   step_in_epoch=self.step_in_epoch,
                                   schedule=self.schedule.state_dict())
        self.lifecycle.save_checkpoint(self.model, self.optimizer, position)

    def _resume(self, checkpoint) -> None:
        """Size the checkpoints and load the chosen one (if any) into the model, the
        optimizer and the trainer's position (run/lifecycle.py records the restart)."""
        pos = self.lifecycle.prepare_checkpoints(self.model, self.optimizer, self.env.device,
                                                 checkpoint)
        if pos is not None:
            self.step, self.epoch, self.step_in_epoch = pos.step, pos.epoch, pos.step_in_epoch
            self.schedule.load_state_dict(pos.schedule)

    # ---- the loop -----------------------------------------------------------
    def train(self) -> Summary:
        """Train to the planned step or the target AUC; each step is a checklist.
        A run stopped by a signal or an error closes its records and raises RunError; so
        does a peer lost in the start barrier or the end-of-run stats collective."""
        run = self._new_run()
        try:
            self._start_clock(run)
            self._train_steps(run)
            comm_stats = self._stop_clock(run)
        except BaseException as e:  # noqa: BLE001 - re-raised, as a RunError where it is one
            run.bar.close()  # what follows is printed on its own line
            stop = self.lifecycle.stop(e, run, self.step / self.data.steps_per_epoch,
                                       self._samples_trained())
            if stop is e:
                raise
            raise stop from None
        return self._end_run(run, comm_stats)

    def _train_steps(self, run: RunProgress) -> None:
        self.lifecycle.begin_steps(run.total)
        for loss in (self._steps() if self.step < run.total else ()):
            self._record_step(run, loss)
            self.lifecycle.after_step(self.step)  # where every rank stops (run/stop.py)
            pause_start = time.perf_counter()  # evaluation and checkpoints: not training time
            evaluated = self.cadence.eval_due(self.step, run.last)
            if evaluated:
                self._run_eval(run.summary, run.start)
            if self.cadence.checkpoint_due(self.step, run.finished):
                self.save_checkpoint()
            run.end_pause(pause_start)
            if evaluated:  # a rank signalled during it asked to stop here
                self.lifecycle.after_pause(self.step)
            if run.finished:
                return

    def _new_run(self) -> RunProgress:
        cfg, env = self.cfg, self.env
        return RunProgress.begin(self.cadence.planned_steps(), self.step, Summary.of_run(cfg, env.world_size),
                                 env.device,
                                 show_bar=env.is_main and cfg.logging.progress_bar)

    def _start_clock(self, run: RunProgress) -> None:
        if self.env.world_size > 1:
            dist.barrier()  # the MLPerf clock starts when every rank is ready
        self.mlperf.run_start()
        run.clock_running = True
        run.start = run.window_start = time.perf_counter()

    def _stop_clock(self, run: RunProgress) -> dict:
        """Stop the MLPerf clock; the comm stats of every rank (a collective)."""
        self.mlperf.run_stop("success" if run.summary.time_to_target_s is not None else "aborted",
                             self.step / self.data.steps_per_epoch, samples_count=self._samples_trained())
        run.clock_running = False
        run.bar.close()
        self.timer.close()
        return collect_comm_stats(self.comm_counters, all_ranks=True)

    def _record_step(self, run: RunProgress, loss: torch.Tensor) -> None:
        """Add the step to the metrics window; every `metrics_every_steps` steps (and at
        the last) log the window's mean loss over ranks, the lr and the sample rate."""
        run.count(self.step, loss)
        if self.step % max(1, self.cfg.logging.metrics_every_steps) and not run.last:
            return
        mean_loss = mean_over_ranks(run.window_loss / run.window_steps, self.env.world_size)
        rate = run.window_steps * self.cfg.run.global_batch_size / run.window_seconds()
        lr = self.optimizer.param_groups[0]["lr"]
        run.summary.losses.append((self.step, mean_loss))
        self.records.log("train", step=self.step, loss=mean_loss, lr=lr, samples_per_s=rate)
        run.bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.3g}", sps=f"{rate:,.0f}")
        run.new_window()

    def _samples_trained(self) -> int:
        """Global samples trained so far (what dlrmv4's MLPerf log counts in)."""
        return self.step * self.cfg.run.global_batch_size

    def _end_run(self, run: RunProgress, comm_stats: dict) -> Summary:
        """Report comm stats, step breakdown and the summary."""
        summary = run.summary
        if comm_stats["tables"]:
            stats_path = self.records.write_json("comm_stats.json", comm_stats)
            self._print(comm_summary(comm_stats, str(stats_path) if stats_path else None))
        if isinstance(self.timer, StepBreakdown):
            self._print(self.timer.render())
            self.records.write_json("step_breakdown.json", self.timer.report())
        run.closed_summary(self.step, self.cfg.run.global_batch_size)
        if self.step > run.first_step or summary.evals:  # a run that did nothing keeps the last
            self.records.write_json("summary.json", summary.as_dict())
        self._print(summary.render())
        return summary

    def _run_eval(self, summary: Summary, run_start: float) -> None:
        epochs_done = self.step / self.data.steps_per_epoch
        samples = self._samples_trained()
        self.mlperf.eval_start(epochs_done, samples_count=samples)
        t0 = time.perf_counter()
        auc, n = self.evaluate()
        self.mlperf.eval_accuracy(auc, epochs_done, samples_count=samples)
        self.mlperf.eval_stop(epochs_done, samples_count=samples)
        result = EvalResult(step=self.step, epoch=self.step / self.data.steps_per_epoch,
                            auc=auc, num_samples=n, seconds=time.perf_counter() - t0)
        summary.evals.append(result)
        self.records.log("eval", **vars(result))
        self._print(f"eval @ step {self.step} (epoch {result.epoch:.2f}): AUC {auc:.5f} "
                    f"over {n:,} samples")
        target = self.cfg.eval.target_auc
        if target is not None and auc >= target and summary.time_to_target_s is None:
            summary.time_to_target_s = time.perf_counter() - run_start

    def close(self) -> None:
        """Close the records and release the run directory (safe to call twice)."""
        self.lifecycle.close()
