"""The Trainer: builds data, sharded model and optimizer; runs train / evaluate.

Reads top to bottom as the architecture: config → data → model → sharding
(+ codecs) → optimizer and schedule → train loop → records.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from tqdm import tqdm

from dlrmtrain.checkpoint import Checkpointer, TrainerPosition
from dlrmtrain.config.schema import Config
from dlrmtrain.comm.stats import collect_comm_stats, format_comm_summary
from dlrmtrain.data import build_datasets, table_rows
from dlrmtrain.distributed.env import DistEnv
from dlrmtrain.distributed.sharding import shard_model
from dlrmtrain.metrics.auc import gather_eval_outputs, roc_auc
from dlrmtrain.mlperf.logger import log_run_setup, open_mlperf_logger
from dlrmtrain.metrics.run_records import open_run_records
from dlrmtrain.metrics.step_breakdown import NoStepBreakdown, StepBreakdown
from dlrmtrain.models import build_model
from dlrmtrain.models.embedding_init import init_embeddings
from dlrmtrain.optim.lr_schedule import MLPerfLRSchedule
from dlrmtrain.optim.optimizers import build_optimizer
from dlrmtrain.precision import autocast


@dataclass
class EvalResult:
    step: int
    epoch: float
    auc: float
    num_samples: int
    seconds: float


@dataclass
class Summary:
    """What a run did; printed at the end and written to summary.json."""

    world_size: int
    steps: int = 0
    samples: int = 0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    target_auc: Optional[float] = None
    time_to_target_s: Optional[float] = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    evals: list[EvalResult] = field(default_factory=list)

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.train_seconds if self.train_seconds else 0.0

    @property
    def final_auc(self) -> Optional[float]:
        return self.evals[-1].auc if self.evals else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size, "steps": self.steps, "samples": self.samples,
            "train_seconds": self.train_seconds, "wall_seconds": self.wall_seconds,
            "samples_per_second": self.samples_per_second, "final_auc": self.final_auc,
            "target_auc": self.target_auc, "reached_target": self.time_to_target_s is not None,
            "time_to_target_s": self.time_to_target_s,
            "evals": [vars(e) for e in self.evals],
            "losses": self.losses,
        }

    def render(self) -> str:
        auc = f"{self.final_auc:.4f}" if self.final_auc is not None else "n/a (eval off)"
        if self.target_auc is None:
            target = "no target set"
        elif self.time_to_target_s is not None:
            target = f"reached {self.target_auc} after {self.time_to_target_s:.1f} s"
        else:
            target = f"NOT reached ({self.target_auc})"
        return "\n".join([
            "=" * 60,
            "dlrmtrain run summary",
            f"  ranks            {self.world_size}",
            f"  steps            {self.steps}  ({self.samples:,} samples)",
            f"  throughput       {self.samples_per_second:,.0f} samples/s "
            f"(training time {self.train_seconds:.1f} s, wall {self.wall_seconds:.1f} s)",
            f"  final eval AUC   {auc}",
            f"  target AUC       {target}",
            "=" * 60,
        ])


class Trainer:
    def __init__(self, cfg: Config, env: DistEnv) -> None:
        self.cfg = cfg
        self.env = env
        self.mlperf = open_mlperf_logger(cfg, env.rank)  # a no-op unless rank 0 and enabled
        self.mlperf.cache_clear()
        self.mlperf.init_start()
        self.records = open_run_records(cfg, env.rank)
        self.data = build_datasets(cfg, env.rank, env.world_size)
        self.model, self.plan_text = self._build_sharded_model()
        self.optimizer = build_optimizer(self.model, cfg.optim)
        o = cfg.optim
        self.schedule = MLPerfLRSchedule(o.lr, o.warmup_steps, o.decay_start_step,
                                         o.decay_steps, o.end_lr)
        self.step = 0           # optimizer steps taken
        self.epoch = 0          # current pass over the training data
        self.step_in_epoch = 0  # batches of this epoch already trained on
        self.pipeline = (TrainPipelineSparseDist(self.model, self.optimizer, env.device,
                                                 custom_model_fwd=self._autocast_forward)
                         if cfg.run.pipeline else None)
        self.timer = (StepBreakdown(env.device) if cfg.logging.step_breakdown
                      else NoStepBreakdown())
        run_dir = Path(cfg.run.output_dir) / cfg.run.name
        self.checkpointer = Checkpointer(Path(cfg.checkpoint.dir or run_dir / "checkpoints"),
                                         cfg.checkpoint.keep, env.rank, log=self._print)
        self._print(self.plan_text)
        self.records.write_text("plan.txt", self.plan_text + "\n")
        self._maybe_resume()
        log_run_setup(self.mlperf, cfg, self.data.num_train_samples, self.data.num_eval_samples)
        self.mlperf.init_stop()

    # ---- building ---------------------------------------------------------
    def _build_sharded_model(self) -> tuple[torch.nn.Module, str]:
        rows = table_rows(self.cfg)
        model = build_model(self.cfg, rows, self.env.device)
        dmp, plan_text = shard_model(model, self.cfg, self.env.device, self.env.world_size)
        init_embeddings(dmp, {f"t_cat_{i}": n for i, n in enumerate(rows)}, self.cfg.run.seed)
        return dmp, plan_text

    def _print(self, text: str) -> None:
        if self.env.is_main:
            tqdm.write(text)

    # ---- one step ---------------------------------------------------------
    def _autocast(self):
        return autocast(self.cfg.precision.mode, self.env.device)

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
            with self.timer.phase("data"):
                batch = next(it, None)
                if batch is not None:
                    batch = batch.to(self.env.device, non_blocking=True)
            if batch is None:
                return
            yield batch

    def _pipelined_steps(self, batches) -> Iterator[torch.Tensor]:
        """TrainPipelineSparseDist: the input all-to-all of batch i+1 runs during batch i.
        Numerically the plain loop: batch i+1 is looked up after batch i's update.
        At the end of the data it drains the batches in flight by itself."""
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
            self.mlperf.epoch_start(self.epoch)
            batches = self._batches(self.epoch, skip=self.step_in_epoch)
            steps = (self._pipelined_steps(batches) if self.pipeline is not None
                     else (self.train_step(b) for b in batches))
            for loss in steps:
                self.step_in_epoch += 1
                yield loss
            self.mlperf.epoch_stop(self.epoch)
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
        for batch, weight in self.data.eval_batches():
            with self._autocast():
                _, (_, logits, batch_labels) = model(batch.to(self.env.device))
            scores.append(logits.float())
            labels.append(batch_labels.float())
            weights.append(weight.to(self.env.device))
        model.train()  # the pipeline re-attaches itself on its next step
        all_scores, all_labels = gather_eval_outputs(torch.cat(scores), torch.cat(labels),
                                                     torch.cat(weights))
        return roc_auc(all_scores, all_labels), all_scores.numel()

    # ---- checkpoints ------------------------------------------------------
    def save_checkpoint(self) -> None:
        position = TrainerPosition(step=self.step, epoch=self.epoch,
                                   step_in_epoch=self.step_in_epoch,
                                   schedule=self.schedule.state_dict())
        path = self.checkpointer.save(self.model, self.optimizer, position)
        self.records.log("checkpoint", step=self.step, path=str(path))

    def _maybe_resume(self) -> None:
        if not self.cfg.checkpoint.resume:
            return
        path = self.checkpointer.latest_valid()
        if path is None:
            self._print(f"resume: no complete checkpoint in {self.checkpointer.root}; "
                        f"starting from step 0")
            return
        pos = self.checkpointer.load(path, self.model, self.optimizer)
        self.step, self.epoch, self.step_in_epoch = pos.step, pos.epoch, pos.step_in_epoch
        self.schedule.load_state_dict(pos.schedule)
        self._print(f"resumed from {path} at step {self.step} (epoch {self.epoch}, "
                    f"batch {self.step_in_epoch})")

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
        cfg, env = self.cfg, self.env
        total = self.planned_steps()
        interval = self.eval_interval()
        ckpt_every = cfg.checkpoint.every_steps
        log_every = max(1, cfg.logging.metrics_every_steps)
        summary = Summary(world_size=env.world_size, target_auc=cfg.eval.target_auc)
        bar = tqdm(total=total, initial=min(self.step, total), desc="train", unit="step",
                   dynamic_ncols=True, disable=not (env.is_main and cfg.logging.progress_bar))
        if env.world_size > 1:
            dist.barrier()  # the MLPerf clock starts when every rank is ready
        self.mlperf.run_start()
        run_start = time.perf_counter()
        paused = 0.0  # eval and checkpoint time, not training
        window_loss = torch.zeros((), device=env.device)
        window_steps, window_start = 0, time.perf_counter()
        first_step = self.step
        steps = self._steps() if self.step < total else iter(())
        for loss in steps:
            window_loss += loss
            window_steps += 1
            bar.update(1)
            last = self.step >= total
            if self.step % log_every == 0 or last:
                mean_loss = self._global_mean(window_loss / window_steps)
                rate = window_steps * cfg.run.global_batch_size / (time.perf_counter() - window_start)
                lr = self.optimizer.param_groups[0]["lr"]
                summary.losses.append((self.step, mean_loss))
                self.records.log("train", step=self.step, loss=mean_loss, lr=lr, samples_per_s=rate)
                bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.3g}", sps=f"{rate:,.0f}")
                window_loss.zero_()
                window_steps = 0
            pause_start = time.perf_counter()
            if cfg.eval.enabled and ((interval and self.step % interval == 0) or last):
                self._run_eval(summary, run_start)
            if (ckpt_every and self.step % ckpt_every == 0) or (last and cfg.checkpoint.at_end):
                self.save_checkpoint()
            paused += time.perf_counter() - pause_start
            if window_steps == 0:
                window_start = time.perf_counter()
            if last or summary.time_to_target_s is not None:
                break
        self.mlperf.run_stop("success" if summary.time_to_target_s is not None else "aborted",
                             self.step / self.data.steps_per_epoch)
        bar.close()
        self.timer.close()
        comm_stats = collect_comm_stats(self.model, all_ranks=True)  # collective
        if comm_stats["tables"]:
            self._print(format_comm_summary(comm_stats))
            self.records.write_json("comm_stats.json", comm_stats)
        if isinstance(self.timer, StepBreakdown):
            self._print(self.timer.render())
            self.records.write_json("step_breakdown.json", self.timer.report())
        summary.steps = self.step
        summary.samples = (self.step - first_step) * cfg.run.global_batch_size
        summary.wall_seconds = time.perf_counter() - run_start
        summary.train_seconds = summary.wall_seconds - paused
        self.records.write_json("summary.json", summary.as_dict())
        self._print(summary.render())
        return summary

    def _run_eval(self, summary: Summary, run_start: float) -> None:
        epochs_done = self.step / self.data.steps_per_epoch
        self.mlperf.eval_start(epochs_done)
        t0 = time.perf_counter()
        auc, n = self.evaluate()
        self.mlperf.eval_accuracy(auc, epochs_done)
        self.mlperf.eval_stop(epochs_done)
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
        self.records.close()
        self.mlperf.close()
