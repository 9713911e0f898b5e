"""The Trainer: builds data, sharded model and optimizer; runs train / evaluate.

Reads top to bottom as the architecture: config → data → model → sharding
(+ codecs) → optimizer and schedule → train loop → records.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from tqdm import tqdm

from dlrmtrain.comm.dedup.source import source_transform
from dlrmtrain.comm.stats import collect_comm_stats
from dlrmtrain.config.schema import Config
from dlrmtrain.data.loader import pins_for
from dlrmtrain.distributed.env import DistEnv, decide_on_rank0
from dlrmtrain.distributed.planner import summarize_plan
from dlrmtrain.metrics.auc import gather_eval_outputs, roc_auc
from dlrmtrain.metrics.step_breakdown import NoStepBreakdown, StepBreakdown
from dlrmtrain.mlperf.benchmarks import COUNTS_SAMPLES
from dlrmtrain.mlperf.eval_grid import EvalGrid, eval_grid_for_config
from dlrmtrain.mlperf.logger import log_run_setup, open_mlperf_logger
from dlrmtrain.optim.lr_schedule import MLPerfLRSchedule
from dlrmtrain.optim.optimizers import build_optimizer
from dlrmtrain.precision import autocast
from dlrmtrain.run.checkpoint import (TRAINER_STATE, Checkpointer, TrainerPosition,
                                      estimate_checkpoint_bytes, free_bytes, human_bytes,
                                      read_manifest)
from dlrmtrain.run.console import comm_summary, plan_summary
from dlrmtrain.run.directory import (RECORD_FILES, RunClaim, checkpoint_dir_of, claim_run_dir,
                                    run_dir_of)
from dlrmtrain.run.errors import (EXIT_USER_ERROR, CheckpointWriteError, DataError,
                                  RunAlreadyFinished, RunError, RunInterrupted, SetupError,
                                  data_errors, signal_name)
from dlrmtrain.run.identity import lossless_codec_changes, math_config
from dlrmtrain.run.leftovers import remove_dead_partials
from dlrmtrain.run.lock import RunLock
from dlrmtrain.run.parent import PARENT_DEATH_SIGNAL, parent_gone
from dlrmtrain.run.peers import note_step, peer_failure
from dlrmtrain.run.progress import EvalResult, RunProgress, Summary
from dlrmtrain.run.records import open_run_records, set_aside_torn_lines
from dlrmtrain.run.resume import refuse_resume_without_checkpoint
from dlrmtrain.run.signals import stop_signal, stop_signals_held
from dlrmtrain.run.stop import StopAtLoggingSteps, announce_stop, announced_stop
from dlrmtrain.train_pipeline import build_train_pipeline
from dlrmtrain.validation import resolved_pipeline, unresolved_keys
from dlrmtrain.workloads import build_datasets, build_sharded_model, workload_of


def _mlperf_eval_grid(cfg: Config, train_samples: int) -> Optional[EvalGrid]:
    """The steps a run logged for a benchmark that counts samples (dlrmv4) must evaluate
    at: its rules fix the grid (mlperf.eval_every_data_pct, skip_eval_epoch_pct), so
    eval.evals_per_epoch does not apply. None: evaluate as the eval section says."""
    if not (cfg.mlperf.enabled and workload_of(cfg).benchmark in COUNTS_SAMPLES):
        return None
    try:
        return eval_grid_for_config(cfg, train_samples)
    except ValueError as e:
        raise SetupError(str(e)) from None



class Trainer:
    def __init__(self, cfg: Config, env: DistEnv) -> None:
        """`cfg` is resolved (validation.resolve_config) and validated."""
        missing = unresolved_keys(cfg)
        if missing:
            raise ValueError(f"Trainer needs a resolved config (validation.resolve_config): "
                             f"{', '.join(missing)} still null")
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
            failure = self._agreed_failure(e, step=0)
            self._undo_start(claim)
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
        self._check_data_fills_a_step()
        self._check_not_finished(resume_from, claim)
        workload_of(cfg).check_memory(cfg, self.data.table_rows, env.world_size, env.device)
        self.eval_grid = _mlperf_eval_grid(cfg, self.data.num_train_samples)
        if claim.resuming and env.is_main:  # a torn last line must not take the next record
            set_aside_torn_lines(run_dir_of(cfg), log=self._print)
        self.mlperf = open_mlperf_logger(cfg, env.rank, append=claim.resuming)
        self.mlperf.cache_clear()
        self.mlperf.init_start()
        self.records = open_run_records(cfg, env.rank, claim)
        self.model, self.plan_text = self._build_sharded_model()
        if cfg.comm.dedup_at == "source" and workload_of(cfg).collection_kind == "pooled":  # the loader
            # keeps each feature's distinct bags (sequence embeddings dedup in their sharder)
            self.data.set_sparse_transform(source_transform(self.model, cfg.comm.table_codecs))
        self.optimizer = build_optimizer(self.model, cfg.optim)
        o = cfg.optim
        self.schedule = MLPerfLRSchedule(o.lr, o.warmup_steps, o.decay_start_step,
                                         o.decay_steps, o.end_lr)
        self.step = 0           # optimizer steps taken
        self.epoch = 0          # current pass over the training data
        self.step_in_epoch = 0  # batches of this epoch already trained on
        mode = resolved_pipeline(cfg, env.device.type)  # `auto`: by the device
        self.pipeline = build_train_pipeline(mode, self.model, self.optimizer,
                                             env.device, self._autocast_forward)
        self.timer = (StepBreakdown(env.device) if cfg.logging.step_breakdown
                      else NoStepBreakdown())
        plan_path = self.records.write_text("plan.txt", self.plan_text + "\n")
        rows = self.data.table_rows
        self._print(plan_summary(f"sharding plan ({cfg.sharding.planner}, {len(rows)} tables)",
                                 summarize_plan(self.model.plan, rows, cfg.model.embedding_dim),
                                 str(plan_path) if plan_path else None))
        self._check_checkpoint_space()
        self._resume(resume_from, claim)
        if cfg.mlperf.enabled:  # dlrmv4's setup reads its eval grid: only where MLPerf asks
            log_run_setup(self.mlperf, cfg, self.data.num_train_samples,
                          self.data.num_eval_samples)
            self.mlperf.init_stop()

    def _checkpoints_enabled(self) -> bool:
        return bool(self.cfg.checkpoint.every_steps or self.cfg.checkpoint.at_end)

    def _check_checkpoint_space(self) -> None:
        """Warn at start when the checkpoint directory cannot hold `keep` + 1 checkpoints
        (retention deletes the oldest only after the next one is complete)."""
        if not self._checkpoints_enabled():
            return
        size = estimate_checkpoint_bytes(self.model, self.optimizer, self.env.rank,
                                         self.env.device)  # a collective
        self.checkpointer.expected_bytes = size
        needed = (self.cfg.checkpoint.keep + 1) * size
        free = free_bytes(self.checkpointer.root)
        if free < needed:
            self._print(f"warning: {self.checkpointer.root} has {human_bytes(free)} free; "
                        f"checkpoint.keep={self.cfg.checkpoint.keep} needs room for "
                        f"{self.cfg.checkpoint.keep + 1} checkpoints of about "
                        f"{human_bytes(size)} ({human_bytes(needed)})")

    def _check_not_finished(self, resume_from: Optional[Path], claim: RunClaim) -> None:
        """A resume whose checkpoint already is at the planned last step stops here, before
        any record is opened: a second summary of zero steps would replace the first. So
        does one that found no checkpoint to load in a directory holding records (resume.py)."""
        if resume_from is None:
            if self.cfg.checkpoint.resume and claim.resuming:
                decide_on_rank0(lambda: refuse_resume_without_checkpoint(
                    run_dir_of(self.cfg), self.checkpointer.root, self.checkpointer.rejected,
                    self.planned_steps()), self.env.rank)
            return
        step = json.loads((resume_from / TRAINER_STATE).read_text())["step"]
        planned = self.planned_steps()
        if step >= planned:
            raise RunAlreadyFinished(
                f"{run_dir_of(self.cfg)} already finished: its checkpoint {resume_from.name} "
                f"is at step {step}, the planned last step is {planned}; nothing trained, "
                f"every record left as it was. Raise run.max_steps or run.epochs to train on.")

    def _check_data_fills_a_step(self) -> None:
        """No full global batch means no step ever: stop now rather than loop over
        empty epochs (the same numbers on every rank, so every rank stops)."""
        if self.data.steps_per_epoch > 0:
            return
        gbs, world = self.cfg.run.global_batch_size, self.env.world_size
        raise SetupError(
            f"{self.data.num_train_samples} training rows do not fill one global batch of "
            f"{gbs} ({gbs // world} per rank × world size {world}): no training step can run. "
            f"Lower run.global_batch_size or use more training data.")

    # ---- building ---------------------------------------------------------
    def _build_sharded_model(self) -> tuple[torch.nn.Module, str]:
        return build_sharded_model(self.cfg, self.data.table_rows, self.env.device,
                                   self.env.world_size)

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

    def train_step(self, batch) -> torch.Tensor:
        """Forward, backward (embedding update happens inside it), dense update.
        Returns this rank's loss, detached; no host sync."""
        self.step += 1
        self.schedule.apply(self.step, [self.optimizer])
        self.optimizer.zero_grad()  # also hands the new rate to the fused optimizer
        with self.timer.phase("forward"), self._autocast():
            loss, _ = self.model(batch)
        with self.timer.phase("backward"):
            loss.backward()
        with self.timer.phase("optimizer"):
            self.optimizer.step()
        self.timer.step_ends()
        return loss.detach()

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
            yield batch

    def train_on(self, batches) -> Iterator[torch.Tensor]:
        """Train on `batches` (on the device) as run.pipeline says; yields each step's
        local loss. A pipeline drains the batches in flight at their end."""
        if self.pipeline is None:
            return (self.train_step(b) for b in batches)
        return self._pipelined_steps(batches)

    def _pipelined_steps(self, batches) -> Iterator[torch.Tensor]:
        """Steps through the run.pipeline pipeline (dlrmtrain/train_pipeline.py): the
        plain loop's numbers, batch i+1 looked up after batch i's update. At the end
        of the data it drains the batches in flight by itself."""
        it = iter(batches)
        while True:
            self.schedule.apply(self.step + 1, [self.optimizer])  # before its zero_grad
            try:
                with self.timer.phase("pipelined step"):
                    loss, _, _ = self.pipeline.progress(it)
            except StopIteration:
                return
            self.step += 1
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

    def _global_mean(self, value: torch.Tensor) -> float:
        """Mean over ranks (a sync point: call only when logging)."""
        value = value.detach().float().clone()
        if self.env.world_size > 1:
            dist.all_reduce(value)
            value /= self.env.world_size
        return value.item()

    # ---- evaluation -------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> tuple[float, int]:
        """Exact AUC over the whole eval set (every rank gets the same value)."""
        model = self.pipeline.detach() if self.pipeline is not None else self.model
        model.eval()
        scores, labels, weights = [], [], []
        for batch, weight in data_errors(DataError).wrap(self.data.eval_batches()):
            self._stop_during_eval()  # a SIGTERM does not wait for the whole evaluation
            with self._autocast():
                _, (_, logits, batch_labels) = model(batch.to(self.env.device))
            scores.append(logits.float())  # fp32 already: models compute logits in fp32 (precision.py)
            labels.append(batch_labels.float())
            weights.append(weight.to(self.env.device))
        model.train()  # the pipeline re-attaches itself on its next step
        all_scores, all_labels = gather_eval_outputs(torch.cat(scores), torch.cat(labels),
                                                     torch.cat(weights))
        return roc_auc(all_scores, all_labels), all_scores.numel()

    # ---- checkpoints ------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Save; a failed save stops the run (CheckpointWriteError, on every rank), or
        with `checkpoint.on_error=warn` is reported and training goes on. A second stop
        signal during the save stops the run once it has ended (and is recorded)."""
        with stop_signals_held(f"the checkpoint save of step {self.step}", self._last_checkpoint):
            self._save_checkpoint()

    def _last_checkpoint(self) -> str:
        last = self.checkpointer.last_step
        return "last checkpoint " + (f"step {last}" if last is not None else "none")

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
            if claim.adopt_run_id:  # no run.json (e.g. records lost): the checkpoint's run
                self.checkpointer.run_id = self.checkpointer.run_id_of(path)
            pos = self.checkpointer.load(path, self.model, self.optimizer)
            self.step, self.epoch, self.step_in_epoch = pos.step, pos.epoch, pos.step_in_epoch
            self.schedule.load_state_dict(pos.schedule)
            self._print(f"resumed from {path} at step {self.step} (epoch {self.epoch}, "
                        f"batch {self.step_in_epoch})")
        codecs = self._codec_changes(path)
        if not claim.resuming or claim.adopt_run_id:
            self.records.set_identity(self.checkpointer.run_id, self.math)
        if claim.resuming:
            self.records.log_resumed(self.step, str(path) if path else None, epoch=self.epoch,
                                     step_in_epoch=self.step_in_epoch, codec_changes=codecs)

    def _codec_changes(self, path: Optional[Path]) -> dict[str, list]:
        """`key: [checkpoint's, now]` of a lossless codec change since the checkpoint
        (allowed: the same model trains on), said once and kept in the resumed record."""
        saved = (read_manifest(path) or {}).get("math_config") if path is not None else None
        changes = {k: [a, b] for k, a, b in lossless_codec_changes(saved or {}, self.math)} \
            if saved else {}
        for key, (before, now) in changes.items():
            self._print(f"resume: {key} {before} → {now} (lossless both: the same model trains on)")
        return changes

    # ---- the loop -----------------------------------------------------------
    def planned_steps(self) -> int:
        steps = math.floor(self.cfg.run.epochs * self.data.steps_per_epoch)
        if self.cfg.run.max_steps is not None:
            steps = min(steps, self.cfg.run.max_steps)
        return max(steps, 1)

    def eval_interval(self) -> int:
        per_epoch = self.cfg.eval.evals_per_epoch
        if not self.cfg.eval.enabled or per_epoch == 0:
            return 0
        return max(1, self.data.steps_per_epoch // per_epoch)

    def train(self) -> Summary:
        """Train to the planned step or the target AUC; each step is a checklist.
        A run stopped by a signal or an error closes its records and raises RunError."""
        run = self._begin_run()
        stops = self._stops = StopAtLoggingSteps(run.total, self.cfg.logging.metrics_every_steps)
        try:
            for loss in self._steps_until(run.total):
                self._record_step(run, loss)
                self._stop_if_signalled(stops.after_step(self.step, stop_signal()))
                pause_start = time.perf_counter()  # evaluation and checkpoints: not training time
                evaluated = self._eval_due(run)
                if evaluated:
                    self._run_eval(run.summary, run.start)
                if self._checkpoint_due(run):
                    self.save_checkpoint()
                run.end_pause(pause_start)
                if evaluated:  # a rank signalled during it asked to stop here (_stop_during_eval)
                    self._stop_if_signalled(stops.after_pause(self.step))
                if run.finished:
                    break
        except BaseException as e:  # noqa: BLE001 - re-raised, as a RunError where it is one
            stop = self._stop_run(run, e)
            if stop is e:
                raise
            raise stop from None
        return self._end_run(run)

    def _stop_during_eval(self) -> None:
        """A stop signal in an evaluation: a world of one stops at once; ranks ask for the stop
        after this evaluation (its gather is their meeting point: run/stop.py) and go on."""
        signum = stop_signal()
        if signum is None:
            return
        if self.env.world_size == 1:
            raise RunInterrupted(signum, self._interrupted_message(signum, self.step))
        if self._stops is not None:
            self._stops.during_pause(self.step, signum)

    def _stop_if_signalled(self, request: Optional[dict]) -> None:
        """Stop where every rank stops: at the step the job's stop request names (this rank's
        or another rank's stop signal asked for it: run/stop.py)."""
        if request is not None:
            signum = request["exit_code"] - 128
            raise RunInterrupted(signum, self._interrupted_message(signum, self.step))

    def _interrupted_message(self, signum: int, step: int) -> str:
        last = self.checkpointer.last_step
        why = " (its launcher died)" if parent_gone() else ""
        return (f"interrupted by {signal_name(signum)}{why} at step {step}; last checkpoint "
                + (f"step {last}" if last is not None else "none"))

    def _agreed_failure(self, error: BaseException, step: int) -> BaseException:
        """The error this rank ends with, the same on every rank. A rank that decided
        (a SetupError or RunError of its own) leaves it in the job's store for the
        others; a rank whose collective then broke reads it there and ends the same
        way. A collective that broke because a peer is gone or does not answer is a
        PeerFailure naming it (run/peers.py), also after the stop signal torchrun sends
        when it sees a rank die. An error after a stop signal is the interruption.
        Anything else is a bug and is returned as it is (it keeps its traceback)."""
        # the job's store lives in the launcher: once that is dead, asking it only waits
        store_alive = not parent_gone()
        if not store_alive and not isinstance(error, RunInterrupted):  # whatever broke after
            return RunInterrupted(PARENT_DEATH_SIGNAL,
                                  self._interrupted_message(PARENT_DEATH_SIGNAL, step))
        if isinstance(error, (SetupError, RunError)):
            if store_alive and not isinstance(error, RunAlreadyFinished):
                announce_stop(str(error), getattr(error, "exit_code", EXIT_USER_ERROR))
            return error
        announced = announced_stop() if store_alive else None
        if announced is not None:  # a peer stopped first: that broke our collective
            code = announced["exit_code"]
            if code == EXIT_USER_ERROR:
                return SetupError(announced["message"])
            stop = (RunInterrupted(code - 128, announced["message"]) if code > 128
                    else RunError(announced["message"]))
            stop.exit_code = code
            return stop
        checkpoint = self.checkpointer.last_step if hasattr(self, "checkpointer") else None
        lost = peer_failure(error, step, checkpoint)
        if lost is not None:  # a peer died, froze or timed out: named, and told to the others
            announce_stop(str(lost), lost.exit_code)
            return lost
        signum = stop_signal()
        if signum is not None:
            return RunInterrupted(signum, self._interrupted_message(signum, step))
        return error

    def _undo_start(self, claim: RunClaim) -> None:
        """A start that failed leaves nothing behind: the records a new run began are
        removed (a retry then needs no run.overwrite), those of a resumed one closed."""
        for opened in ("records", "mlperf"):
            if hasattr(self, opened):
                getattr(self, opened).close()
        if self.env.is_main and not claim.resuming:
            for name in RECORD_FILES:
                (run_dir_of(self.cfg) / name).unlink(missing_ok=True)

    def _stop_run(self, run: RunProgress, error: BaseException) -> BaseException:
        """Close the progress bar and the records of a run that cannot go on; return the
        error to raise. An error after a stop signal (a peer that stopped first broke a
        collective) is the interruption; one after another rank announced its stop ends
        this rank the same way. Anything else is a bug and keeps its traceback."""
        run.bar.close()  # what follows is printed on its own line
        error = self._agreed_failure(error, run.completed)
        if isinstance(error, SetupError):  # a peer refused the start this rank got past
            refused = RunError(str(error))
            refused.exit_code = EXIT_USER_ERROR
            error = refused
        if not isinstance(error, RunError):
            return error
        try:
            self.records.log("stopped", step=run.completed, reason=str(error))
            self.mlperf.run_stop("aborted", self.step / self.data.steps_per_epoch,
                                samples_count=self._samples_trained())
        except Exception:  # noqa: BLE001 - the records themselves may be what failed
            pass
        self.close()
        return error

    def _begin_run(self) -> RunProgress:
        cfg, env = self.cfg, self.env
        total = self.planned_steps()
        bar = tqdm(total=total, initial=min(self.step, total), desc="train", unit="step",
                   dynamic_ncols=True, disable=not (env.is_main and cfg.logging.progress_bar))
        if env.world_size > 1:
            dist.barrier()  # the MLPerf clock starts when every rank is ready
        self.mlperf.run_start()
        return RunProgress(
            total=total, first_step=self.step, completed=self.step, bar=bar,
            summary=Summary(world_size=env.world_size, target_auc=cfg.eval.target_auc,
                            codec=self._codec_label()),
            window_loss=torch.zeros((), device=env.device))

    def _codec_label(self) -> str:
        """The run's codec and its per-table overrides, e.g. `dedup (t_cat_3: none)`."""
        overrides = ", ".join(f"{t}: {c}" for t, c in sorted(self.cfg.comm.table_codecs.items()))
        return self.cfg.comm.codec + (f" ({overrides})" if overrides else "")

    def _steps_until(self, total: int) -> Iterator[torch.Tensor]:
        return self._steps() if self.step < total else iter(())

    def _record_step(self, run: RunProgress, loss: torch.Tensor) -> None:
        """Add the step to the metrics window; every `metrics_every_steps` steps (and at
        the last) log the window's mean loss over ranks, the lr and the sample rate."""
        run.window_loss += loss
        run.window_steps += 1
        run.completed = self.step
        note_step(self.step)  # for the heartbeat's thread (run/peers.py)
        run.bar.update(1)
        run.last = self.step >= run.total
        if self.step % max(1, self.cfg.logging.metrics_every_steps) and not run.last:
            return
        mean_loss = self._global_mean(run.window_loss / run.window_steps)
        rate = run.window_steps * self.cfg.run.global_batch_size / run.window_seconds()
        lr = self.optimizer.param_groups[0]["lr"]
        run.summary.losses.append((self.step, mean_loss))
        self.records.log("train", step=self.step, loss=mean_loss, lr=lr, samples_per_s=rate)
        run.bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.3g}", sps=f"{rate:,.0f}")
        run.window_loss.zero_()
        run.window_steps = 0

    def _samples_trained(self) -> int:
        """Global samples trained so far (what dlrmv4's MLPerf log counts in)."""
        return self.step * self.cfg.run.global_batch_size

    def _eval_due(self, run: RunProgress) -> bool:
        if self.eval_grid is not None:  # the benchmark's rules place every eval
            return self.cfg.eval.enabled and self.eval_grid.is_eval_step(self.step)
        interval = self.eval_interval()
        return self.cfg.eval.enabled and ((interval and self.step % interval == 0) or run.last)

    def _checkpoint_due(self, run: RunProgress) -> bool:
        every = self.cfg.checkpoint.every_steps
        # at_end: also a run that stops early at its target AUC ends here
        return bool((every and self.step % every == 0) or (run.finished and self.cfg.checkpoint.at_end))

    def _end_run(self, run: RunProgress) -> Summary:
        """Stop the MLPerf clock; report comm stats, step breakdown and the summary."""
        summary = run.summary
        self.mlperf.run_stop("success" if summary.time_to_target_s is not None else "aborted",
                             self.step / self.data.steps_per_epoch, samples_count=self._samples_trained())
        run.bar.close()
        self.timer.close()
        comm_stats = collect_comm_stats(self.model, all_ranks=True)  # collective
        if comm_stats["tables"]:
            stats_path = self.records.write_json("comm_stats.json", comm_stats)
            self._print(comm_summary(comm_stats, str(stats_path) if stats_path else None))
        if isinstance(self.timer, StepBreakdown):
            self._print(self.timer.render())
            self.records.write_json("step_breakdown.json", self.timer.report())
        summary.steps = self.step
        summary.samples = (self.step - run.first_step) * self.cfg.run.global_batch_size
        summary.wall_seconds = time.perf_counter() - run.start
        summary.stalled_seconds = run.stalled_seconds()
        summary.train_seconds = summary.wall_seconds - run.paused - summary.stalled_seconds
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
