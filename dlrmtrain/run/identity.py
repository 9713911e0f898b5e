"""Who a run is: a run id, and the fingerprint of the config keys that change its math.

Checkpoints and run directories carry both, so that a run never continues
another run's state (resume compares the math-changing keys and names those
that differ) and never deletes another run's files.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import asdict
from typing import Any

from dlrmtrain.config.schema import Config

# Config entries that do NOT change what a step computes: how long to train,
# what to log or evaluate, where files go. Everything else (batch, seed, data,
# model, sharding, codec, optimizer, precision) is part of the fingerprint.
_NOT_MATH = {
    "run.name", "run.output_dir", "run.device", "run.epochs", "run.max_steps", "run.pipeline",
    "run.overwrite", "run.collective_timeout_s", "run.ddp_bucket_mb",
    "data.path", "data.prefetch_batches", "data.multi_hot_cache_dir", "data.verify",
    "data.verify_max_gb",
}
_NOT_MATH_SECTIONS = {"eval", "checkpoint", "logging", "mlperf"}


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value and prefix.count(".") < 2 and not prefix.endswith(
            ("tables", "table_ranks", "table_codecs")):
        for key, sub in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, sub, out)
    else:
        out[prefix] = value


def math_config(cfg: Config, world_size: int) -> dict[str, Any]:
    """The flat `section.key → value` entries that change the training math."""
    flat: dict[str, Any] = {}
    _flatten("", asdict(cfg), flat)
    math = {k: v for k, v in flat.items()
            if k not in _NOT_MATH and k.split(".")[0] not in _NOT_MATH_SECTIONS}
    math["world_size"] = world_size
    return json.loads(json.dumps(math))  # as a manifest reads it back (tuples → lists)


def fingerprint(math: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(math, sort_keys=True).encode()).hexdigest()[:16]


def differing_keys(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: saved → current` for every math-changing entry that differs."""
    keys = sorted(set(saved) | set(current))
    return [f"{k}: {saved.get(k, '<absent>')!r} → {current.get(k, '<absent>')!r}"
            for k in keys if saved.get(k, "<absent>") != current.get(k, "<absent>")]
