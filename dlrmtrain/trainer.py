"""The Trainer: builds data, sharded model and optimizer; runs train / evaluate.

Reads top to bottom as the architecture: config → data → model → sharding
(+ codecs) → optimizer and schedule → train loop → records.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from tqdm import tqdm

from dlrmtrain.comm.auto.source import dedup_at_the_source
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
from dlrmtrain.run.cadence import Cadence, refuse_empty_epochs
from dlrmtrain.run.checkpoint import Checkpointer, TrainerPosition
from dlrmtrain.run.console import codec_label, comm_summary, plan_summary
from dlrmtrain.run.directory import RunClaim, checkpoint_dir_of, claim_run_dir, run_dir_of
from dlrmtrain.run.errors import (CheckpointWriteError, DataError, RunError, RunInterrupted,
                                  SetupError, data_errors)
from dlrmtrain.run.failure import (agreed_failure, as_run_stop, interrupted_message,
                                   last_checkpoint_text)
from dlrmtrain.run.identity import math_config
from dlrmtrain.run.leftovers import remove_dead_partials
from dlrmtrain.run.lock import RunLock
from dlrmtrain.run.peers import note_step
from dlrmtrain.run.progress import EvalResult, RunProgress, Summary
from dlrmtrain.run.rank0 import decide_on_rank0
from dlrmtrain.run.records import open_run_records, set_aside_torn_lines
from dlrmtrain.run.resume import codec_changes_since, refuse_what_cannot_resume
from dlrmtrain.run.signals import stop_signal, stop_signals_held
from dlrmtrain.run.stop import StopAtLoggingSteps
from dlrmtrain.run.teardown import (FailureRecords, opened_as_writer, records_of_lost_writer,
                                    undo_start, undo_start_of_lost_writer, writes_for_lost_rank0)
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
        self.math = math_config(cfg, env.world_size)
        # Everything that can refuse the run comes before anything is written: whose run
        # directory this is (rank 0 locks it for the run's life), which checkpoint to
        # resume, whether the data fills a step.
        self.run_lock = RunLock(run_dir_of(cfg))
        claim = decide_on_rank0(lambda: claim_run_dir(cfg, self.run_lock), env.rank)
        try:
            self._build(claim)
        except BaseException as e:  # noqa: BLE001 - re-raised, as the agreed error where it is one
            failure = agreed_failure(e, 0, self._last_checkpoint_step())
            undo_start(self._failure_records(), run_dir_of(cfg),
                       remove_records=env.is_main and not claim.resuming)
            if writes_for_lost_rank0(failure, env.rank):  # rank 0 began the records: gone
                undo_start_of_lost_writer(
                    run_dir_of(cfg), claim.run_id, self.run_lock, claim.resuming,
                    lambda: opened_as_writer(cfg, claim.run_id), stop=(0, str(failure)))
            self.run_lock.release()  # refused or broken before training: free the directory
            if failure is e:
                raise
            raise failure from None

    def _build(self, claim: RunClaim) -> None:
        cfg, env = self.cfg, self.env
        self._stops: Optional[StopAtLoggingSteps] = None  # the running train()'s (run/stop.py)
        self.checkpointer = Checkpointer(checkpoint_dir_of(cfg), cfg.checkpoint.keep,
                                         env.rank, claim.run_id, self.math, log=self._print)
        if env.is_main:
            remove_dead_partials(self.checkpointer.root, log=self._print)
        resume_from = (self.checkpointer.latest_valid(any_run=claim.adopt_run_id)
                       if cfg.checkpoint.resume else None)
        with data_errors(SetupError):
            self.data = build_datasets(cfg, env.rank, env.world_size, pin_memory=pins_for(env.device))
        refuse_empty_epochs(self.data.num_train_samples, self.data.steps_per_epoch,
                            cfg.run.global_batch_size, env.world_size)
        self.cadence = Cadence(cfg, self.data.steps_per_epoch)
        refuse_what_cannot_resume(cfg, claim.resuming, resume_from, self.checkpointer,
                                  self.cadence.planned_steps(), env.rank)
        workload_of(cfg).check_memory(cfg, self.data.table_rows, env.world_size, env.device)
        self.cadence.eval_grid = mlperf_eval_grid(cfg, workload_of(cfg).benchmark,
                                                  self.data.num_train_samples)
        if claim.resuming and env.is_main:  # a torn last line must not take the next record
            set_aside_torn_lines(run_dir_of(cfg), log=self._print)
        self.records = open_run_records(cfg, env.rank, claim)
        if not claim.resuming:  # first: records begun say whose they are (run/teardown.py)
            self.records.set_identity(claim.run_id, self.math)
        self.mlperf = open_mlperf_logger(cfg, workload_of(cfg).benchmark, env.rank, append=claim.resuming)
        self.mlperf.cache_clear()
        self.mlperf.init_start()
        self.model, self.plan_text = build_sharded_model(cfg, self.data.table_rows, env.device,
                                                         env.world_size)
        self.source_auto = dedup_at_the_source(cfg.comm, workload_of(cfg).collection_kind,
                                               self.model, self.data, env.device)
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
        if cfg.checkpoint.every_steps or cfg.checkpoint.at_end:  # room for keep + 1 of them?
            self.checkpointer.expect_size(self.model, self.optimizer, env.device)
        self._resume(resume_from, claim)
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
        does not wait for the whole evaluation (_stop_during_eval)."""
        batches = data_errors(DataError).wrap(self.data.eval_batches())
        if self.source_auto is not None:  # the current choice's form
            batches = ((self.source_auto.pick_for_eval(b), w) for b, w in batches)
        return evaluate_auc(self.pipeline.detach(), batches, self.env.device, self._autocast,
                            before_batch=self._stop_during_eval)

    # ---- checkpoints ------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Save; a failed save stops the run (CheckpointWriteError, on every rank), or
        with `checkpoint.on_error=warn` is reported and training goes on. A second stop
        signal during the save stops the run once it has ended (and is recorded)."""
        with stop_signals_held(f"the checkpoint save of step {self.step}",
                               lambda: last_checkpoint_text(self.checkpointer.last_step)):
            self._save_checkpoint()

    def _save_checkpoint(self) -> None:
        position = TrainerPosition(step=self.step, epoch=self.epoch,
                                   step_in_epoch=self.step_in_epoch,
                                   schedule=self.schedule.state_dict())
        try:
            path = self.checkpointer.save(self.model, self.optimizer, position)
        except CheckpointWriteError as e:
            if self.cfg.checkpoint.on_error != "warn":
                raise
            self._print(f"warning: {e}; training on (checkpoint.on_error=warn)")
            self.records.log("checkpoint_failed", step=self.step, error=str(e))
            return
        self.records.log("checkpoint", step=self.step, path=str(path))

    def _resume(self, path: Optional[Path], claim: RunClaim) -> None:
        """Load the chosen checkpoint (if any); record the run's identity, and where a
        resumed run restarted."""
        if self.cfg.checkpoint.resume and path is None:
            self._print(f"resume: no complete checkpoint of this run in "
                        f"{self.checkpointer.root}; starting from step 0")
        if path is not None:
            pos = self.checkpointer.resume(path, self.model, self.optimizer, claim.adopt_run_id)
            self.step, self.epoch, self.step_in_epoch = pos.step, pos.epoch, pos.step_in_epoch
            self.schedule.load_state_dict(pos.schedule)
        codecs = codec_changes_since(path, self.math, log=self._print)
        if claim.adopt_run_id:  # the resumed checkpoint's run id (a new run's: _build)
            self.records.set_identity(self.checkpointer.run_id, self.math)
        if claim.resuming:
            self.records.log_resumed(self.step, str(path) if path else None, epoch=self.epoch,
                                     step_in_epoch=self.step_in_epoch, codec_changes=codecs)

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
            stop = self._stop_run(run, e)
            if stop is e:
                raise
            raise stop from None
        return self._end_run(run, comm_stats)

    def _train_steps(self, run: RunProgress) -> None:
        stops = self._stops = StopAtLoggingSteps(run.total, self.cfg.logging.metrics_every_steps)
        for loss in (self._steps() if self.step < run.total else ()):
            self._record_step(run, loss)
            self._stop_if_signalled(stops.after_step(self.step, stop_signal()))
            pause_start = time.perf_counter()  # evaluation and checkpoints: not training time
            evaluated = self.cadence.eval_due(self.step, run.last)
            if evaluated:
                self._run_eval(run.summary, run.start)
            if self.cadence.checkpoint_due(self.step, run.finished):
                self.save_checkpoint()
            run.end_pause(pause_start)
            if evaluated:  # a rank signalled during it asked to stop here (_stop_during_eval)
                self._stop_if_signalled(stops.after_pause(self.step))
            if run.finished:
                return

    def _stop_during_eval(self) -> None:
        """A stop signal in an evaluation: a world of one stops at once; ranks ask for the stop
        after this evaluation (its gather is their meeting point: run/stop.py) and go on."""
        signum = stop_signal()
        if signum is not None and self.env.world_size == 1:
            raise self._interrupted(signum)
        if self._stops is not None:
            self._stops.during_pause(self.step, signum)

    def _stop_if_signalled(self, request: Optional[dict]) -> None:
        """Stop where every rank stops: at the step the job's stop request names (this rank's
        or another rank's stop signal asked for it: run/stop.py)."""
        if request is not None:
            raise self._interrupted(request["exit_code"] - 128)

    def _interrupted(self, signum: int) -> RunInterrupted:
        return RunInterrupted(signum, interrupted_message(signum, self.step, self._last_checkpoint_step()))

    def _last_checkpoint_step(self) -> Optional[int]:
        return self.checkpointer.last_step if hasattr(self, "checkpointer") else None

    def _open_mlperf_as_writer(self):
        return open_mlperf_logger(self.cfg, workload_of(self.cfg).benchmark, 0, append=True)

    def _failure_records(self) -> FailureRecords:
        return FailureRecords(getattr(self, "records", None), getattr(self, "mlperf", None))

    def _stop_run(self, run: RunProgress, error: BaseException) -> BaseException:
        """Close the bar and the records of a run that cannot go on; return the error every
        rank ends with (run/failure.py). Anything but a RunError is a bug: its traceback stays."""
        run.bar.close()  # what follows is printed on its own line
        error = as_run_stop(agreed_failure(error, run.completed, self._last_checkpoint_step()))
        if not isinstance(error, RunError):
            return error
        records = self._failure_records()
        if writes_for_lost_rank0(error, self.env.rank):  # rank 0 kept the records: gone
            records = records_of_lost_writer(
                run_dir_of(self.cfg), self.checkpointer.run_id, self.run_lock,
                lambda: opened_as_writer(self.cfg, self.checkpointer.run_id, self._open_mlperf_as_writer)) or records
        records.stopped(run.completed, str(error), self.step / self.data.steps_per_epoch,
                        self._samples_trained(), clock_running=run.clock_running)
        records.close()
        self.close()
        return error

    def _new_run(self) -> RunProgress:
        cfg, env = self.cfg, self.env
        summary = Summary(world_size=env.world_size, target_auc=cfg.eval.target_auc,
                          codec=codec_label(cfg.comm.codec, cfg.comm.table_codecs))
        return RunProgress.begin(self.cadence.planned_steps(), self.step, summary, env.device,
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
        return collect_comm_stats(self.model, all_ranks=True)

    def _record_step(self, run: RunProgress, loss: torch.Tensor) -> None:
        """Add the step to the metrics window; every `metrics_every_steps` steps (and at
        the last) log the window's mean loss over ranks, the lr and the sample rate."""
        run.count(self.step, loss)
        note_step(self.step)  # for the heartbeat's thread (run/peers.py)
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
        self.records.close()
        self.mlperf.close()
        self.run_lock.release()
