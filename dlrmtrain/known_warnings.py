"""TorchRec's and fbgemm's known, harmless warnings, filtered in this one place.

Installed when `dlrmtrain` is imported, so every rank, test and tool gets the
same filter (the warnings would otherwise print once per rank per run):

- TorchRec 1.8's DistributedModelParallel passes `broadcast_buffers` to DDP,
  which torch 2.13 deprecates (FutureWarning); TorchRec's to fix, not ours.
- fbgemm-gpu-cpu 1.8 warns (DeprecationWarning, in colour) that its SSD
  optimizer lookups failed to import (GPU/SSD-only, unused here) and that a
  module TorchRec imports is deprecated.
- torch 2.13 deprecates ShardedTensor (FutureWarning "Please use DTensor instead"),
  the type TorchRec's sharded tables are; torch.distributed.checkpoint touches them
  when it loads a checkpoint (4 lines on every resume of 2 ranks). Silenced only
  around the checkpoint calls (`checkpoint_calls_quiet`), so code of ours that used
  ShardedTensor directly would still be told.

Anything else still shows.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

KNOWN_WARNINGS = (
    # (category, message regex, module regex)
    (FutureWarning, r"`broadcast_buffers` is deprecated", r"torchrec\."),
    (DeprecationWarning, r"", r"fbgemm_gpu\."),
)


SHARDED_TENSOR_DEPRECATION = r"Please use DTensor instead and we are deprecating ShardedTensor"


@contextmanager
def checkpoint_calls_quiet() -> Iterator[None]:
    """Around a torch.distributed.checkpoint call on TorchRec's state: torch's deprecation
    of the ShardedTensor it is made of is not ours to act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=SHARDED_TENSOR_DEPRECATION, category=FutureWarning)
        yield


def filter_known_warnings() -> None:
    for category, message, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def pytest_filter_lines() -> list[str]:
    """The same filters in pytest's `filterwarnings` form (pytest resets the filters per test)."""
    return [f"ignore:{message}:{category.__name__}:{module}"
            for category, message, module in KNOWN_WARNINGS]
