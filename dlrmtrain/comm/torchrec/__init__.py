"""TorchRec's (and torch's) private internals, reached through this package alone.

Every private attribute or method of TorchRec (and fbgemm, torch) that dlrmtrain.comm and the
train pipeline read, replace or override is reached through a named helper in one module of this
package, one module per concern:

- `sharded.py`: what a sharded module's shardings and stock dists hold (both collection kinds)
- `contexts.py`: what the codec layer leaves in a sharding context (both ends' ids, plans made ahead)
- `pooled.py`: the sharded EmbeddingBagCollection that records both ends' ids
- `pooled_source.py`: the stock sharded EBC under dedup at the source (the expand in one row gather,
  row-wise variable-batch dists over Gloo)
- `vbe.py`: fbgemm's variable-batch metadata kernel, replaced on CPU
- `sequence.py`: the sharded EmbeddingCollection (ids recorded; dedup at the source)
- `sharder.py`: TorchRec's `shard()` call repeated, with its recorded signatures
- `pipelines.py`: TorchRec's train pipelines that plan ahead, and the streamless fused one
- `torch_internals.py`: torch's storage use count
- `kernels.py`: every lookup emits the row dtype asked for (CPU kernels: fp32 rounded once to bf16;
  a rank without tables: an empty stand-in of that dtype)

So a TorchRec upgrade is checked against this package alone (comm/README.md, "TorchRec hook
points"). Importing any of its modules fails with a clear message on any TorchRec version other
than the one these hooks were written and tested against (the check below runs first).

Where TorchRec's own call has to be repeated (the sharder's `shard()` builds the sharded module
with TorchRec's arguments plus ours), tests/comm/test_torchrec_hooks.py compares TorchRec's
signatures with the ones recorded in `sharder.py` and fails when they change. Nothing is
re-exported here.
"""

from __future__ import annotations

import torchrec

SUPPORTED_TORCHREC = "1.8.0"


def check_torchrec_version(version: str) -> None:
    """Refuse a TorchRec whose internals these hooks were not checked against."""
    if version.split("+")[0] != SUPPORTED_TORCHREC:
        raise ImportError(
            f"dlrmtrain.comm hooks into TorchRec {SUPPORTED_TORCHREC} internals, but TorchRec {version} is "
            f"installed; install torchrec=={SUPPORTED_TORCHREC}, or re-check every helper in "
            f"dlrmtrain/comm/torchrec/ (see comm/README.md) and update SUPPORTED_TORCHREC")
