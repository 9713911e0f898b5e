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
from dlrmtrain.comm.codec import CollectionKind, EmbeddingCommCodec, check_kind_takes_hierarchy
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


def available_codecs() -> list[str]:
    """Names accepted by `comm.codec` and `comm.table_codecs` (config validation uses this)."""
    return sorted(_CODECS)


def run_codecs(names: Iterable[str], auto: AutoConfig | None = None) -> dict[str, EmbeddingCommCodec]:
    """The codec a run's all-to-alls use for each of `names`: the registered one, except `auto`,
    built with the run's `comm.auto` (`auto`; None: the defaults)."""
    return {n: AutoCodec(auto) if n == "auto" else get_codec(n) for n in names}


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
    under the codecs that run under it (`dedup`, `auto`: none or two-level dedup, and per-table
    `none`; `EmbeddingCommCodec.runs_under_node_hierarchy`). Errors name the key."""
    if hierarchy.kind not in HIERARCHIES:
        raise ValueError(f"comm.hierarchy: {hierarchy.kind!r} is not one of {', '.join(HIERARCHIES)}")
    if hierarchy.ranks_per_node is not None and hierarchy.ranks_per_node < 1:
        raise ValueError(f"comm.ranks_per_node: must be at least 1, got {hierarchy.ranks_per_node}")
    if hierarchy.kind != "node":
        return
    check_kind_takes_hierarchy(hierarchy, kind)
    for key, name in [("comm.codec", codec), *((f"comm.table_codecs.{t}", c) for t, c in table_codecs.items())]:
        if name not in _CODECS or not _CODECS[name].runs_under_node_hierarchy:
            raise ValueError(f"{key}: {name!r} cannot run under comm.hierarchy: node, which carries the "
                             f"lossless 'dedup', 'auto' and per-table 'none' only; use comm.codec: dedup or "
                             f"comm.hierarchy: flat")


def check_source_codecs(dedup_at: str, codec: str, table_codecs: Mapping[str, str], hierarchy: str,
                        per_table: tuple[str, ...], per_table_rule: str, codecs: tuple[str, ...] = ("dedup",)
                        ) -> bool:
    """The rules every `comm.dedup_at: source` path shares (a lossless codec of `codecs`, only the
    per-table codecs `per_table`, flat); True when `source` is asked for. Errors name the key."""
    if dedup_at == "owner":
        return False
    if dedup_at != "source":
        raise ValueError(f"comm.dedup_at: {dedup_at!r} is not one of owner, source")
    where = "comm.dedup_at: source"
    if codec not in codecs:
        raise ValueError(f"{where} needs comm.codec: {' or '.join(codecs)}, got {codec!r} (the lossy "
                         f"dedup+fp16/bf16{'' if 'auto' in codecs else ' and auto'} are not built at the source "
                         f"here); use comm.dedup_at: owner")
    for table, name in table_codecs.items():
        if name not in per_table:
            raise ValueError(f"comm.table_codecs.{table}: {name!r} cannot run under {where}: {per_table_rule}")
    if hierarchy != "flat":
        raise ValueError(f"{where} runs over comm.hierarchy: flat only; comm.hierarchy: {hierarchy} "
                         f"takes comm.dedup_at: owner")
    return True


def validate_dedup_at(dedup_at: str, codec: str, table_codecs: Mapping[str, str], hierarchy: str,
                      optimizer: str) -> None:
    """`comm.dedup_at: source` on pooled tables (comm/dedup/source.py, through TorchRec's
    variable-batch EBC) is built for the lossless `dedup` and `auto` (comm/auto/source.py), flat,
    in the plain loop and every pipeline, with an embedding optimizer fbgemm's variable-batch TBE
    trains (SGD); per-table `none` is kept whole. Sequence embeddings: embedding.py's
    `validate_sequence_dedup_at`. Errors name the key."""
    if not check_source_codecs(dedup_at, codec, table_codecs, hierarchy, ("dedup", "none"),
                               "it carries 'dedup' and per-table 'none' only", ("dedup", "auto")):
        return
    where = "comm.dedup_at: source"
    if optimizer == "adagrad":  # fbgemm's TBE asserts it in its variable-batch metadata
        raise ValueError(f"{where}: fbgemm's variable-batch TBE does not train EXACT_ADAGRAD tables "
                         f"(optim.name: adagrad; it takes SGD, row-wise Adagrad and Adam); use optim.name: "
                         f"sgd or comm.dedup_at: owner")


DEDUPING_CODECS = ("dedup", "auto", "dedup+fp16", "dedup+bf16")
"""The codecs that find distinct rows (an unset `comm.dedup_at` is resolved only for them)."""


def dedup_at_default(codec: str, table_codecs: Mapping[str, str], hierarchy: str, optimizer: str,
                     kind: CollectionKind, row_wise: Callable[[], tuple[int, int]] = lambda: (0, 0)
                     ) -> tuple[str, str | None]:
    """What an unset `comm.dedup_at` becomes, and why when it is `owner` for a reason: `source`
    where this run's codec dedups and its path carries it (the rules `validate_dedup_at` and
    `embedding.validate_sequence_dedup_at` enforce on an explicit `source`), else `owner`
    (reason None when no codec of the run dedups: the key then does nothing). `row_wise()`:
    (row-wise tables, tables that cross the all-to-all) in the config's plan, asked last."""
    if not any(n in DEDUPING_CODECS for n in (codec, *table_codecs.values())):
        return "owner", None
    reason = _source_blocker(codec, table_codecs, hierarchy, optimizer, kind)
    if reason is None and kind == "pooled" and 2 * (rows := row_wise())[0] > rows[1]:
        # Row-wise tables at the source: TorchRec's reduce-scatter sends every owner's (zero)
        # partial of every distinct bag, world size x the distinct rows, where owner-side dedup
        # sends the distinct rows once; rows outweigh ids (dim 128 fp32: 512 B against 8 B), so
        # when most tables are row-wise the output's growth with world size outweighs the ids
        # and lookups saved. A few row-wise tables among table-wise ones stay at the source.
        reason = (f"sharding: {rows[0]} of {rows[1]} tables row-wise: at the source their "
                  f"output sends world size x the distinct rows")
    return ("owner", reason) if reason else ("source", None)


def _source_blocker(codec: str, table_codecs: Mapping[str, str], hierarchy: str, optimizer: str,
                    kind: CollectionKind) -> str | None:
    """Why `comm.dedup_at: source` is refused on this run (a short reason naming the key), or None."""
    if codec in ("dedup+fp16", "dedup+bf16"):
        return f"comm.codec: {codec}: the lossy stacks dedup at the owner"
    codecs, per_table = ("dedup", "auto"), (("dedup", "none") if kind == "pooled" else (codec,))
    if codec not in codecs:
        return f"comm.codec: {codec}: {kind} tables dedup at the source under {' or '.join(codecs)} only"
    for table, name in table_codecs.items():
        if name not in per_table:
            return f"comm.table_codecs.{table}: {name}: not carried at the source"
    if hierarchy != "flat":
        return f"comm.hierarchy: {hierarchy}: two levels dedup at the owner"
    if kind == "pooled" and optimizer == "adagrad":
        return "optim.name: adagrad: fbgemm's variable-batch TBE refuses EXACT_ADAGRAD"
    return None


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
