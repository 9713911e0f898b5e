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

from dlrmtrain.comm.declarations import lossy_codecs
from dlrmtrain.comm.labels import PLACEMENT_KEY
from dlrmtrain.config.schema import Config

# Config entries that do NOT change what a step computes: how long to train,
# what to log or evaluate, where files go. Everything else (batch, seed, data,
# model, sharding, codec, optimizer, precision) is part of the fingerprint.
_NOT_MATH = {
    "run.name", "run.output_dir", "run.device", "run.epochs", "run.max_steps", "run.pipeline",
    "run.overwrite", "run.collective_timeout_s", "run.stall_warn_s", "run.ddp_bucket_mb",
    "data.path", "data.prefetch_batches", "data.multi_hot_cache_dir", "data.verify",
    "data.verify_max_gb", "data.workers",
}
_NOT_MATH_SECTIONS = {"eval", "checkpoint", "logging", "mlperf"}
_NOT_MATH_PREFIXES = ("comm.auto.", "sharding.uvm_caching.")
"""`comm.auto`: when lossless `auto` takes which lossless path; `sharding.uvm_caching`: where a
table's fp32 rows live (host memory behind an exact HBM cache), not what they are. Checkpoints
written before either section existed still resume."""


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
            if k not in _NOT_MATH and k.split(".")[0] not in _NOT_MATH_SECTIONS
            and not k.startswith(_NOT_MATH_PREFIXES)}
    math["world_size"] = world_size
    return json.loads(json.dumps(math))  # as a manifest reads it back (tuples → lists)


def fingerprint(math: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(math, sort_keys=True).encode()).hexdigest()[:16]


def differing_keys(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """`key: saved → current` for every math-changing entry that differs, less a change
    between lossless codecs (lossless_codec_changes)."""
    allowed = {k for k, *_ in lossless_codec_changes(saved, current)}
    return [f"{k}: {a!r} → {b!r}" for k, a, b in _changes(saved, current) if k not in allowed]


def _changes(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    keys = sorted(set(saved) | set(current))
    return [(k, saved.get(k, "<absent>"), current.get(k, "<absent>")) for k in keys
            if saved.get(k, "<absent>") != current.get(k, "<absent>")]


CODEC_KEYS = ("comm.codec", "comm.table_codecs", PLACEMENT_KEY)
"""The math entries that only choose how the embedding all-to-all is carried (the placement:
where lossless `dedup` finds the distinct bags, comm/placement.py; the tables and their
optimizer state are the same)."""


def lossless_codec_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved, current) of the codec entries that changed with every codec before
    and after lossless (none, dedup, auto: their forward is bitwise none's, with dedup at the
    owner or at the source), so resuming
    across them trains the same model; a change to or from a lossy codec is not one."""
    lossy = set(lossy_codecs())
    changed = [c for c in _changes(saved, current) if c[0] in CODEC_KEYS]
    names = {n for _, a, b in changed for v in (a, b)
             for n in (v.values() if isinstance(v, dict) else [v])}
    names |= {saved.get("comm.codec"), current.get("comm.codec")}
    return changed if changed and not names & lossy else []
