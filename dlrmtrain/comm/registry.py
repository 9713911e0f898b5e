"""Codec names → codec instances, and the per-table codec choice from config.

Lossless: `none`, `dedup`, and `auto` (per all-to-all and table, whichever of
the two measures faster). LOSSY (training differs from `none`): TorchRec's
qcomms `fp16`, `bf16`, `int8`, `fp8` (GPU only), and dedup stacked with a
lossy wire precision, `dedup+fp16`, `dedup+bf16`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

import torch
from torchrec.distributed.fbgemm_qcomm_codec import CommType

from dlrmtrain.comm.auto.codec import AutoCodec
from dlrmtrain.comm.codec import CollectionKind, EmbeddingCommCodec, check_declared, check_kind_takes_hierarchy
from dlrmtrain.comm.codecs.lossy import LossyQCommsCodec
from dlrmtrain.comm.codecs.none import NoneCodec
from dlrmtrain.comm.dedup.codec import DedupCodec
from dlrmtrain.comm.labels import CODEC_NAMES
from dlrmtrain.comm.topology import HIERARCHIES, Hierarchy
from dlrmtrain.config.schema import AutoConfig

logger = logging.getLogger(__name__)

_CODECS: dict[str, EmbeddingCommCodec] = {c.name: c for c in (
    NoneCodec(),
    DedupCodec(),
    AutoCodec(),
    DedupCodec(wire_dtype=torch.float16),
    DedupCodec(wire_dtype=torch.bfloat16),
    LossyQCommsCodec("fp16", CommType.FP16),
    LossyQCommsCodec("bf16", CommType.BF16),
    LossyQCommsCodec("int8", CommType.INT8),
    LossyQCommsCodec("fp8", CommType.FP8),
)}
assert sorted(_CODECS) == sorted(CODEC_NAMES), "config.schema.CodecName must list the registered codecs"
for _codec in _CODECS.values():
    check_declared(_codec)


def register_codec(codec: EmbeddingCommCodec) -> None:
    """Register a codec by its name after checking what it declares (codec.check_declared): what
    the table above does for the built-in ones (a codec in the package adds itself there, and its
    name to config.schema.CodecName)."""
    check_declared(codec)
    if codec.name in _CODECS:
        raise ValueError(f"a codec named {codec.name!r} is registered already")
    _CODECS[codec.name] = codec


def find_codec(name: str) -> EmbeddingCommCodec | None:
    """The codec called `name`, None when none is."""
    return _CODECS.get(name)


def codecs_that(holds: Callable[[EmbeddingCommCodec], bool]) -> list[str]:
    """The names of the registered codecs for which `holds(codec)`, in registration order."""
    return [name for name, codec in _CODECS.items() if holds(codec)]


def available_codecs() -> list[str]:
    """Names accepted by `comm.codec` and `comm.table_codecs` (config validation uses this)."""
    return sorted(_CODECS)


def run_codecs(names: Iterable[str], auto: AutoConfig | None = None) -> dict[str, EmbeddingCommCodec]:
    """The codec a run's all-to-alls use for each of `names`: the registered one as the run uses
    it (`EmbeddingCommCodec.for_run`: with the run's `comm.auto`; None: the defaults)."""
    return {n: get_codec(n).for_run(auto) for n in names}


def lossy_codecs() -> list[str]:
    """The names among `available_codecs()` that change what the model trains on."""
    return sorted(n for n, c in _CODECS.items() if not c.lossless)


def get_codec(name: str, where: str = "comm.codec") -> EmbeddingCommCodec:
    """The codec called `name`; `where` names the config key in the error."""
    try:
        return _CODECS[name]
    except KeyError:
        raise ValueError(f"{where}: unknown codec {name!r}; available: {available_codecs()}") from None


def validate_hierarchy(hierarchy: Hierarchy, codec: str, table_codecs: Mapping[str, str],
                       kind: CollectionKind = "pooled") -> None:
    """`comm.hierarchy: node` carries pooled embeddings (`kind`: codec.check_kind_takes_hierarchy)
    under the codecs that run under it (`EmbeddingCommCodec.runs_under_two_levels`). Errors name the key."""
    if hierarchy.kind not in HIERARCHIES:
        raise ValueError(f"comm.hierarchy: {hierarchy.kind!r} is not one of {', '.join(HIERARCHIES)}")
    if hierarchy.ranks_per_node is not None and hierarchy.ranks_per_node < 1:
        raise ValueError(f"comm.ranks_per_node: must be at least 1, got {hierarchy.ranks_per_node}")
    if hierarchy.kind != "node":
        return
    check_kind_takes_hierarchy(hierarchy, kind)
    for key, name in [("comm.codec", codec), *((f"comm.table_codecs.{t}", c) for t, c in table_codecs.items())]:
        if name not in _CODECS or not _CODECS[name].runs_under_two_levels:
            able = ", ".join(repr(n) for n in codecs_that(lambda c: c.runs_under_two_levels))
            raise ValueError(f"{key}: {name!r} cannot run under comm.hierarchy: node, which carries {able} "
                             f"only; use one of them or comm.hierarchy: flat")


def warn_if_lossy(codec: str, table_codecs: Mapping[str, str], what: str) -> None:
    """The startup warning naming the run's LOSSY codecs (`what`: the embeddings they round)."""
    lossy = sorted(n for n in {codec, *table_codecs.values()} if not get_codec(n).lossless)
    if lossy:
        logger.warning("comm codec %s is LOSSY: %s and their gradients are rounded on the wire, so "
                       "training differs from comm.codec=none", ", ".join(lossy), what)


def wire_bytes_per_value(name: str) -> float:
    """Bytes one embedding value takes on the wire under codec `name` (fp32 embeddings).

    int8 is measured from fbgemm's encoder (a 32-value row plus its scale and bias).
    """
    return get_codec(name).wire_bytes_per_value()


def is_qcomms(name: str) -> bool:
    """Whether `name` is one of TorchRec's quantized comms (applied to the whole sharder)."""
    codec = _CODECS.get(name)
    return codec is not None and codec.qcomms_config() is not None


def validate_codec_choice(codec: str, table_codecs: Mapping[str, str], device_type: str | None = None) -> None:
    """Reject unknown names, per-table qcomms, and codecs the device cannot run, before anything is built.

    TorchRec's qcomms quantize a whole all-to-all, so `fp16`/`bf16`/`int8`/`fp8`
    can only be the run's `comm.codec`, with no per-table overrides.
    """
    run_codec = get_codec(codec, "comm.codec")
    for table, name in table_codecs.items():
        get_codec(name, f"comm.table_codecs.{table}")
        if is_qcomms(name) and name != codec:
            raise ValueError(f"comm.table_codecs.{table}: {name!r} is one of TorchRec's quantized comms, "
                             f"which apply to the whole all-to-all; set it as comm.codec instead")
        if is_qcomms(codec) and name != codec:
            raise ValueError(f"comm.table_codecs.{table}: comm.codec={codec!r} (TorchRec quantized comms) "
                             f"applies to every table; per-table overrides are not supported with it")
    if device_type is not None:
        run_codec.check_device(device_type, "comm.codec")


def validate_wire_precision(codec: str, table_codecs: Mapping[str, str], table_precision: str) -> None:
    """A lossy codec rounds each row once, from the lookup's fp32 sum. Where the lookup emits
    bf16 rows (`table_precision` bf16: precision.mode bf16 on a family whose rows follow it,
    precision.py) the wire is already 16-bit, and a lossy codec would round those rows a
    second time: refused, naming the key."""
    if table_precision != "bf16":
        return
    for key, name in [("comm.codec", codec), *((f"comm.table_codecs.{t}", c) for t, c in table_codecs.items())]:
        if not get_codec(name, key).lossless:
            raise ValueError(
                f"{key}: {name!r} under precision.mode=bf16 would round rows twice: the lookup "
                f"already emits bf16 rows (half fp32's bytes on the wire) and {name} rounds them "
                f"again instead of once from the fp32 sum; use a lossless codec (none, dedup, auto: "
                f"bf16 on the wire) or precision.mode=fp32")


def codecs_per_table(codec: str, table_codecs: Mapping[str, str], tables: Iterable[str]) -> dict[str, str]:
    """Codec name for every table: the per-table override, else the run's codec."""
    tables = list(tables)
    unknown = sorted(set(table_codecs) - set(tables))
    if unknown:
        raise ValueError(f"comm.table_codecs names tables the model does not have: {unknown}; "
                         f"tables are {sorted(tables)}")
    return {t: table_codecs.get(t, codec) for t in tables}
