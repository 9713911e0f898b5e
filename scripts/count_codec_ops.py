"""Ops the dedup codec issues per training step, counted with the torch profiler at 2 and 4 ranks.

    PYTHONPATH=. python scripts/count_codec_ops.py [--worlds 2 4] [--batch-per-rank 256] [overrides...]
    PYTHONPATH=. python scripts/count_codec_ops.py comm.dedup_at=source optim.name=sgd   # at the source
    PYTHONPATH=. python scripts/count_codec_ops.py --config configs/mini_dlrmv4.yaml comm.dedup_at=source

For each world size, real ranks (torchrun, Gloo on CPU) train dlrmtrain's own
loop (configs/quickstart.yaml with codec dedup, or --config, plus overrides)
at the same per-rank batch. Every codec function training calls (the dist's
forward and plan-ahead, the transport's four autograd halves) runs inside a
profiler range; after `--warmup` steps, rank 0 counts the aten ops issued
inside those ranges (top-level ops: an op another op calls is not counted
again; views and allocations apart, as they launch no kernel, and a `to`, `reshape` or
`contiguous` that copied nothing) and the
collectives (c10d ops), per step. Printed side by side: the codec's work
must not grow with the world size (issue 26, item 5).

Host syncs: the ops inside those ranges that read a value to the host or size
their output by the data (`item`/`bool`/`int` of a tensor, `nonzero`, `unique`,
`masked_select`): each waits for the device on a GPU.

Under `comm.dedup_at: source` the plan is made where the batch is (the loader's
prefetch thread, not counted: it is off the step's thread) and the step runs
only what TorchRec's variable batch needs beyond `none`: pooled, the expand of
the distinct bags' rows (`RowGatherExpand`, forward and backward: its index, and the gather,
`ExpandRows` or, under DLRM's interaction, `ExpandRowsBehind`) and, on CPU,
the TBE's variable-batch metadata (`vbe_metadata`; fbgemm's CUDA kernel on a
GPU); sequence (DLRMv4), the expand of the distinct ids' rows (one `index_select` per
sharding in TorchRec's `construct_jagged_tensors`, counted as "sequence expand", and its
autograd backward, "sequence expand backward").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_OPEN: list[str] = []
"""the codec ranges open on this thread (innermost last), kept by `_wrap`"""
_STEP: list[int] = [-1]
"""the step `PlainLoop.progress` is in (-1 outside one)"""


def _sync_counter():
    """A TorchFunctionMode counting, per codec range and step, the calls that make a GPU wait for
    the host or the host for the GPU (as tests/comm/sync_counter.py: reading a tensor's value,
    data-sized outputs, repeat_interleave without output_size, a device tensor from a list)."""
    import torch
    from torch.overrides import TorchFunctionMode

    reads = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.__index__}
    data_sized = {torch.nonzero, torch.Tensor.nonzero, torch.masked_select, torch.Tensor.masked_select,
                  torch.unique, torch.Tensor.unique, torch.unique_consecutive}

    def is_sync(func, args, kwargs) -> bool:
        if func in reads or func in data_sized:
            return True
        if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
        return func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None

    class Counter(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.per_step: dict[tuple[str, int], int] = {}

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if _OPEN and _STEP[0] >= 0 and is_sync(func, args, kwargs):
                key = (_OPEN[-1], _STEP[0])
                self.per_step[key] = self.per_step.get(key, 0) + 1
            return func(*args, **kwargs)
    return Counter()

NO_KERNEL = frozenset({
    "aten::view", "aten::_reshape_alias", "aten::slice", "aten::select", "aten::unsqueeze",
    "aten::squeeze", "aten::expand", "aten::as_strided", "aten::t", "aten::transpose", "aten::permute",
    "aten::unbind", "aten::split", "aten::split_with_sizes", "aten::alias", "aten::detach", "aten::detach_",
    "aten::view_as",
    "aten::narrow",
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::lift_fresh", "aten::resize_",
    "aten::_unsafe_view", "aten::result_type", "aten::is_nonzero", "aten::item",
    "aten::_local_scalar_dense",
})
MAY_COPY = frozenset({"aten::to", "aten::reshape", "aten::contiguous"})
"""Ops that launch a copy only where the input's dtype, device or layout asks for one: counted
when they did (a copying op under them), not when they returned their input or a view of it."""
COPIES = frozenset({"aten::_to_copy", "aten::clone", "aten::copy_"})
"""views, allocations and scalar reads: ops that launch no kernel (a read is a host sync, counted by the codec)"""


def _wrap(owner, name: str, label: str, static: bool = False) -> None:
    """Run `owner.name` inside a profiler range `codec::label`."""
    import functools

    import torch

    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*a, **k):
        _OPEN.append(label)
        try:
            with torch.profiler.record_function(f"codec::{label}"):
                return fn(*a, **k)
        finally:
            _OPEN.pop()
    setattr(owner, name, staticmethod(wrapper) if static else wrapper)


def _instrument_source() -> None:
    """The step's codec work under comm.dedup_at: source (wrapped before the model is sharded,
    so the kernels registered for fbgemm's ops are the wrapped ones)."""
    from dlrmtrain.comm.dedup import expand
    from dlrmtrain.comm.torchrec import pooled_source, vbe

    _wrap(pooled_source._RowGatherExpand, "_expand_index", "RowGatherExpand.forward")
    for gather in (expand.ExpandRows, expand.ExpandRowsBehind):  # the gather: alone, or behind DLRM's dense row
        _wrap(gather, "forward", "RowGatherExpand.forward", static=True)
        _wrap(gather, "backward", "RowGatherExpand.backward", static=True)
    _wrap(vbe, "vbe_metadata", "vbe_metadata (CPU)")
    _wrap_sequence_expand()


def _wrap_sequence_expand() -> None:
    """TorchRec's expand of the sequence rows under dedup at the source: its `index_select` in
    `construct_jagged_tensors` (when given reverse indices) and that op's backward node."""
    import torch
    import torchrec.distributed.embedding as ec_module

    build = ec_module.construct_jagged_tensors

    def expanding(*a, **k):
        if k.get("reverse_indices") is None:
            return build(*a, **k)
        select, expanded = torch.index_select, []

        def recorded(*sa, **sk):
            expanded.append(select(*sa, **sk))
            return expanded[-1]
        torch.index_select = recorded
        _OPEN.append("sequence expand")
        try:
            with torch.profiler.record_function("codec::sequence expand"):
                out = build(*a, **k)
        finally:
            torch.index_select = select
            _OPEN.pop()
        for t in expanded:
            if t.grad_fn is not None:
                _range_around_node(t.grad_fn, "sequence expand backward")
        return out
    ec_module.construct_jagged_tensors = expanding


def _range_around_node(node, label: str) -> None:
    """Open a codec profiler range when autograd runs `node`, close it when it is done."""
    import torch

    ranges = []

    def before(_grad_outputs):
        ranges.append(torch.profiler.record_function(f"codec::{label}"))
        ranges[-1].__enter__()
        _OPEN.append(label)

    def after(_grad_inputs, _grad_outputs):
        _OPEN.pop()
        ranges.pop().__exit__(None, None, None)
    node.register_prehook(before)
    node.register_hook(after)


def _instrument() -> None:
    from dlrmtrain.comm.dedup import transport
    from dlrmtrain.comm.dedup.dist import DedupDist
    from dlrmtrain.train_pipeline import PlainLoop

    _instrument_source()

    _wrap(DedupDist, "forward", "dist.forward")
    _wrap(DedupDist, "plan_ahead", "dist.plan_ahead")
    if hasattr(DedupDist, "start_with_ids"):  # row-wise: the flags launched with the ids
        _wrap(DedupDist, "start_with_ids", "dist.start_with_ids")
    for fn in (transport._DedupStart, transport._DedupWait):
        for half in ("forward", "backward"):
            _wrap(fn, half, f"{fn.__name__.lstrip('_')}.{half}", static=True)
    step = PlainLoop.progress
    PlainLoop._counted_steps = 0

    def counted_step(self, batches):
        import torch
        with torch.profiler.record_function(f"step::{PlainLoop._counted_steps}"):
            _STEP[0] = PlainLoop._counted_steps
            PlainLoop._counted_steps += 1
            try:
                return step(self, batches)
            finally:
                _STEP[0] = -1
    PlainLoop.progress = counted_step


def _count(events, warmup: int) -> dict:
    """Per codec range: top-level aten ops (kernel-launching) and collectives, in steps >= warmup."""
    ops: dict[str, int] = {}
    collectives: dict[str, int] = {}
    for e in events:
        if not (e.name.startswith("aten::") or e.name.startswith("c10d::")):
            continue
        codec, step, parent_is_op, p = None, None, False, e.cpu_parent
        if p is not None and p.name.startswith(("aten::", "c10d::")):
            parent_is_op = True
        while p is not None:
            if codec is None and p.name.startswith("codec::"):
                codec = p.name[len("codec::"):]
            if p.name.startswith("step::"):
                step = int(p.name[len("step::"):])
            p = p.cpu_parent
        if codec is None or step is None or step < warmup or parent_is_op:
            continue
        if e.name.startswith("c10d::"):
            collectives[codec] = collectives.get(codec, 0) + 1
        elif e.name in MAY_COPY:
            if any(c.name in COPIES for c in e.cpu_children):
                ops[codec] = ops.get(codec, 0) + 1
        elif e.name not in NO_KERNEL:
            ops[codec] = ops.get(codec, 0) + 1
    return {"ops": ops, "collectives": collectives}


def rank_main(args) -> None:
    """One rank of a torchrun group: train, count, rank 0 writes the counts to --out."""
    import torch

    from dlrmtrain.config import load_config
    from dlrmtrain.distributed.env import init_distributed, shutdown_distributed
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config

    _instrument()
    world = int(os.environ["WORLD_SIZE"])
    steps = args.warmup + args.steps
    overrides = ["comm.codec=dedup", "eval.enabled=false", f"run.max_steps={steps}",
                 f"run.global_batch_size={args.batch_per_rank * world}", "run.name=count_codec_ops",
                 f"run.output_dir={tempfile.gettempdir()}/dlrmtrain_count_ops_{world}", "run.overwrite=true",
                 "logging.progress_bar=false", *args.overrides]
    cfg = resolve_config(load_config(args.config, overrides))
    env = init_distributed(cfg.run.device)
    trainer = Trainer(cfg, env)
    syncs = _sync_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, syncs:
        trainer.train()
    if env.is_main:
        counts = _count(prof.events(), args.warmup)
        counts["syncs"] = {}
        for (codec, step), n in syncs.per_step.items():
            if step >= args.warmup:
                counts["syncs"][codec] = counts["syncs"].get(codec, 0) + n
        counts = {kind: {k: v / args.steps for k, v in per.items()} for kind, per in counts.items()}
        Path(args.out).write_text(json.dumps({"world": world, **counts}))
    trainer.close()
    del trainer
    shutdown_distributed()


def _print_side_by_side(results: list[dict]) -> None:
    worlds = [r["world"] for r in results]
    print("dedup codec ops per training step (rank 0, top-level aten ops that launch work; collectives and "
          "host syncs apart)")
    print(f"  {'function':<28}" + "".join(f"{f'{w} ranks':>10}" for w in worlds))
    for kind in ("ops", "collectives", "syncs"):
        names = sorted({n for r in results for n in r[kind]})
        for n in names:
            print(f"  {kind[:4] + ' ' + n:<28}" + "".join(f"{r[kind].get(n, 0):>10.1f}" for r in results))
        print(f"  {kind + ' total':<28}" + "".join(f"{sum(r[kind].values()):>10.1f}" for r in results))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--batch-per-rank", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3, help="steps not counted (key widths learned, buffers made)")
    p.add_argument("--steps", type=int, default=3, help="steps counted")
    p.add_argument("--config", default=str(REPO / "configs/quickstart.yaml"))
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)  # a rank's output file (internal)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    if "WORLD_SIZE" in os.environ:
        rank_main(args)
        return
    results = []
    for world in args.worlds:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
                   __file__, "--out", f.name, "--batch-per-rank", str(args.batch_per_rank), "--warmup",
                   str(args.warmup), "--steps", str(args.steps), "--config", args.config, *args.overrides]
            subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            results.append(json.loads(Path(f.name).read_text()))
    _print_side_by_side(results)


if __name__ == "__main__":
    main()
