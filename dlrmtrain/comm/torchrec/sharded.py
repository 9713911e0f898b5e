"""What a sharded module's shardings and stock dists hold (TorchRec privates; EBC and EC alike)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torchrec.distributed.types import ShardingEnv


# ------------------------------------------------------------ sharded EBC or EC
def output_dists(sharded: nn.Module) -> list[nn.Module]:
    """The output dist of each sharding of a sharded EBC or EC, in sharding order."""
    return list(sharded._output_dists)


def replace_output_dist(sharded: nn.Module, i: int, new_dist: nn.Module) -> None:
    sharded._output_dists[i] = new_dist


def sharding_env(sharded: nn.Module) -> ShardingEnv:
    return sharded._env


# -------------------------------------------------------------------- shardings
def grouped_configs_per_rank(sharding) -> list[list[Any]]:
    """Table-/column-wise: each rank's grouped embedding configs, in wire order."""
    return sharding._grouped_embedding_configs_per_rank


def grouped_configs(sharding) -> list[Any]:
    """Row-wise: the grouped embedding configs every rank holds a row block of."""
    return sharding._grouped_embedding_configs


# --------------------------------------------------------------------- dists
def dist_callbacks(stock_dist: nn.Module) -> list:
    """The stock dist's output callbacks (column-wise: the shard reorder, differentiable)."""
    return list(getattr(stock_dist, "_callbacks", None) or [])


def qcomm_codecs(stock_dist: nn.Module):
    """The `QuantizedCommCodecs` a stock dist quantizes with, or None."""
    codecs = getattr(stock_dist, "_codecs", None)
    return codecs if codecs is not None else getattr(getattr(stock_dist, "_dist", None), "_codecs", None)
