"""The first thing each rank of a torchrun-launched benchmark does (bench_train.py, profile_two_level.py)."""

from __future__ import annotations


def start_cpu_rank():
    """Quiet the FX tracer's warnings (TorchRec traces the model), one intra-op thread per rank
    (the ranks share the machine's cores), then the process group on CPU (Gloo); returns the
    rank's `DistEnv`. Imports torch here, not at module level, so a script's launcher process
    (which only becomes torchrun) never pays for it."""
    import logging

    import torch

    from dlrmtrain.distributed.env import init_distributed

    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    return init_distributed("cpu")
