"""Where dedup's time goes: wall time per codec function over real training steps.

    torchrun --standalone --nproc_per_node 2 scripts/profile_dedup.py [--steps 40] [overrides...]

Runs dlrmtrain's own training loop (configs/quickstart.yaml or --config, plus overrides,
codec dedup unless overridden) with timers wrapped around the functions
training calls: the table-wise planner's stages, the sequence planner
(`--config configs/mini_dlrmv4.yaml`), the transport's gradient sums and the
four row kernels.
Rank 0 prints ms per step for each, after the first 5 steps (warm-up).
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOTALS: collections.Counter = collections.Counter()


def wrap_calls(owner, name: str, record) -> None:
    """Replace `owner.name` by a wrapper that calls `record(args, t0, t1)` after each call."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            record(a, t0, time.perf_counter())
    setattr(owner, name, wrapper)


def timed(owner, name: str, label: str) -> None:
    """Add the wall time of every call of `owner.name` to `TOTALS[label]`."""
    wrap_calls(owner, name, lambda _args, t0, t1: TOTALS.update({label: t1 - t0}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--config", default=str(REPO / "configs/quickstart.yaml"),
                   help="run config (default: configs/quickstart.yaml)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    from dlrmtrain.comm.dedup import buffers, table_wise, transport
    from dlrmtrain.comm.dedup.dist import DedupDist
    from dlrmtrain.comm.dedup.sequence import SequencePlanner
    from dlrmtrain.config import load_config
    from dlrmtrain.validation import resolve_config
    from dlrmtrain.distributed.env import init_distributed, shutdown_distributed
    from dlrmtrain.trainer import Trainer

    P = table_wise.TableWisePlanner
    for name in ("_uniques", "_read_counts", "_build_plan", "_account"):
        timed(P, name, f"plan.{name}")
    timed(P, "plan", "plan (total)")
    timed(SequencePlanner, "plan", "sequence plan (total)")
    timed(transport, "gradient_sums", "gradient sums (backward encode)")
    for name in ("gather_rows", "expand_rows", "segment_sum_rows"):
        timed(transport, name, f"kernel.{name}")
    timed(buffers, "scatter_rows", "kernel.scatter_rows")
    timed(buffers.BufferPool, "scattered", "grad buffer (reset + scatter)")
    timed(transport, "timed_wait", "transfer wait")
    timed(DedupDist, "forward", "dist.forward (plan + launch)")

    overrides = ["comm.codec=dedup", "comm.dedup_at=owner", "eval.enabled=false",  # the owner-side planner it times f"run.max_steps={args.steps}",
                 "run.name=profile_dedup", "run.output_dir=/tmp/dlrmtrain_profile", "run.overwrite=true",
                 "logging.progress_bar=false",
                 *args.overrides]
    cfg = resolve_config(load_config(args.config, overrides))
    env = init_distributed(cfg.run.device)
    trainer = Trainer(cfg, env)
    trainer.train()
    if env.is_main:
        steps = args.steps
        print(f"dedup codec time per training step (ms, rank 0, mean over {steps} steps incl. warm-up):")
        for label, s in sorted(TOTALS.items(), key=lambda kv: -kv[1]):
            print(f"  {label:<34} {s / steps * 1e3:8.2f}")
    trainer.close()
    del trainer
    shutdown_distributed()


if __name__ == "__main__":
    main()
