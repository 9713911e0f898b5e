"""The config's codec choice checked against what the codecs declare (declarations.py): names
that exist, TorchRec's qcomms run-wide only, the device, the wire precision and the hierarchy.
Torch-free apart from topology's `Hierarchy`, so the CLI checks a config without TorchRec;
the sharders ask the same rules again (install.py). Errors name the config key.
"""

from __future__ import annotations

from collections.abc import Mapping

from dlrmtrain.comm.declarations import CodecDeclaration, CollectionKind, codecs_that, declaration
from dlrmtrain.comm.topology import HIERARCHIES, Hierarchy


def check_kind_takes_hierarchy(hierarchy: Hierarchy, kind: CollectionKind) -> None:
    """`comm.hierarchy: node` has a two-level route for pooled embeddings only: the one
    statement of the rule, asked by `validate_hierarchy` (config validation, with the model
    family's `Workload.collection_kind`, and each sharder) and by the codecs."""
    if hierarchy.kind == "node" and kind != "pooled":
        raise ValueError("comm.hierarchy: node covers pooled embeddings only; sequence embeddings "
                         "take comm.hierarchy: flat")


def check_device(codec: CodecDeclaration, device_type: str, where: str = "comm.codec") -> None:
    """Refuse, naming `where`, a codec that cannot run on `device_type` (`gpu_only`)."""
    if codec.gpu_only and device_type != "cuda":
        elsewhere = codecs_that(lambda d: d.qcomms and not d.gpu_only)
        use = f"; on {device_type} use {', '.join(elsewhere[:-1])} or {elsewhere[-1]}" if elsewhere else ""
        raise ValueError(f"{where}: {'lossless' if codec.lossless else 'lossy'} codec {codec.name!r} "
                         f"runs on GPU only ({codec.gpu_only}){use}")


def validate_codec_choice(codec: str, table_codecs: Mapping[str, str], device_type: str | None = None) -> None:
    """Reject unknown names, per-table qcomms, and codecs the device cannot run, before anything is built.

    TorchRec's qcomms quantize a whole all-to-all, so `fp16`/`bf16`/`int8`/`fp8`
    can only be the run's `comm.codec`, with no per-table overrides.
    """
    run_codec = declaration(codec, "comm.codec")
    for table, name in table_codecs.items():
        table_codec = declaration(name, f"comm.table_codecs.{table}")
        if table_codec.qcomms and name != codec:
            raise ValueError(f"comm.table_codecs.{table}: {name!r} is one of TorchRec's quantized comms, "
                             f"which apply to the whole all-to-all; set it as comm.codec instead")
        if run_codec.qcomms and name != codec:
            raise ValueError(f"comm.table_codecs.{table}: comm.codec={codec!r} (TorchRec quantized comms) "
                             f"applies to every table; per-table overrides are not supported with it")
    if device_type is not None:
        check_device(run_codec, device_type, "comm.codec")


def validate_wire_precision(codec: str, table_codecs: Mapping[str, str], table_precision: str) -> None:
    """A lossy codec rounds each row once, from the lookup's fp32 sum. Where the lookup emits
    bf16 rows (`table_precision` bf16: precision.mode bf16 on a family whose rows follow it,
    precision.py) the wire is already 16-bit, and a lossy codec would round those rows a
    second time: refused, naming the key."""
    if table_precision != "bf16":
        return
    for key, name in [("comm.codec", codec), *((f"comm.table_codecs.{t}", c) for t, c in table_codecs.items())]:
        if not declaration(name, key).lossless:
            raise ValueError(
                f"{key}: {name!r} under precision.mode=bf16 would round rows twice: the lookup "
                f"already emits bf16 rows (half fp32's bytes on the wire) and {name} rounds them "
                f"again instead of once from the fp32 sum; use a lossless codec (none, dedup, auto: "
                f"bf16 on the wire) or precision.mode=fp32")


def validate_hierarchy(hierarchy: Hierarchy, codec: str, table_codecs: Mapping[str, str],
                       kind: CollectionKind = "pooled") -> None:
    """`comm.hierarchy: node` carries pooled embeddings (`kind`: `check_kind_takes_hierarchy`)
    under the codecs that run under it (`runs_under_two_levels`). Errors name the key."""
    if hierarchy.kind not in HIERARCHIES:
        raise ValueError(f"comm.hierarchy: {hierarchy.kind!r} is not one of {', '.join(HIERARCHIES)}")
    if hierarchy.ranks_per_node is not None and hierarchy.ranks_per_node < 1:
        raise ValueError(f"comm.ranks_per_node: must be at least 1, got {hierarchy.ranks_per_node}")
    if hierarchy.kind != "node":
        return
    check_kind_takes_hierarchy(hierarchy, kind)
    for key, name in [("comm.codec", codec), *((f"comm.table_codecs.{t}", c) for t, c in table_codecs.items())]:
        try:
            able_here = declaration(name, key).runs_under_two_levels
        except ValueError:
            able_here = False
        if not able_here:
            able = ", ".join(repr(n) for n in codecs_that(lambda d: d.runs_under_two_levels))
            raise ValueError(f"{key}: {name!r} cannot run under comm.hierarchy: node, which carries {able} "
                             f"only; use one of them or comm.hierarchy: flat")
