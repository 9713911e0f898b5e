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


def _dedups_at_source(codec: EmbeddingCommCodec) -> bool:
    return codec.dedups and "sample" in codec.sides


def _source_blocker(codec: str, table_codecs: Mapping[str, str], hierarchy: str, optimizer: str | None,
                    kind: CollectionKind) -> tuple[str, str] | None:
    """Why `comm.dedup_at: source` cannot carry this run: (the error for an explicit `source`, naming
    the key; the short reason an unset key prints), or None. `optimizer` None: not checked. Pooled
    tables whose codec does not dedup travel whole at the source; an EmbeddingCollection's tables
    all take the run's codec there."""
    where, run = "comm.dedup_at: source", find_codec(codec)
    if run is None or not _dedups_at_source(run):
        able = " or ".join(codecs_that(_dedups_at_source))
        why = ("dedups at the owner only" if run is not None and run.dedups
               else f"{kind} tables dedup at the source under {able} only")
        return (f"{where} needs comm.codec: {able}, got {codec!r} ({why}); use comm.dedup_at: owner",
                f"comm.codec: {codec}: {why}")
    for table, name in table_codecs.items():
        other = find_codec(name)
        whole = other is not None and not other.dedups and "sample" in other.sides
        if name != codec and not (kind == "pooled" and whole):
            rule = (f"it carries {codec!r} and per-table codecs that keep their tables whole" if kind == "pooled"
                    else "the run's codec covers every table of the EmbeddingCollection at the source")
            return (f"comm.table_codecs.{table}: {name!r} cannot run under {where}: {rule}",
                    f"comm.table_codecs.{table}: {name}: not carried at the source")
    if hierarchy != "flat":
        return (f"{where} runs over comm.hierarchy: flat only; comm.hierarchy: {hierarchy} takes "
                f"comm.dedup_at: owner", f"comm.hierarchy: {hierarchy}: two levels dedup at the owner")
    if kind == "pooled" and optimizer == "adagrad":  # fbgemm's TBE asserts it in its variable-batch metadata
        return (f"{where}: fbgemm's variable-batch TBE does not train EXACT_ADAGRAD tables (optim.name: "
                f"adagrad; it takes SGD, row-wise Adagrad and Adam); use optim.name: sgd or comm.dedup_at: owner",
                "optim.name: adagrad: fbgemm's variable-batch TBE refuses EXACT_ADAGRAD")
    return None


def validate_dedup_at(dedup_at: str | None, codec: str, table_codecs: Mapping[str, str], hierarchy: str,
                      optimizer: str | None, kind: CollectionKind = "pooled") -> None:
    """`comm.dedup_at: source` (pooled: comm/dedup/source.py, through TorchRec's variable-batch
    EBC; sequence: dedup/sequence_source.py) is built for the codecs that dedup there
    (`EmbeddingCommCodec.sides`), flat, in the plain loop and every pipeline; pooled, with an
    embedding optimizer fbgemm's variable-batch TBE trains (SGD). Errors name the key; an unset
    value (resolved by `dedup_at_default`) and `owner` pass."""
    if dedup_at in (None, "owner"):
        return
    if dedup_at != "source":
        raise ValueError(f"comm.dedup_at: {dedup_at!r} is not one of owner, source")
    blocked = _source_blocker(codec, table_codecs, hierarchy, optimizer, kind)
    if blocked is not None:
        raise ValueError(blocked[0])


def dedup_at_default(codec: str, table_codecs: Mapping[str, str], hierarchy: str, optimizer: str,
                     kind: CollectionKind, row_wise: Callable[[], tuple[int, int]] = lambda: (0, 0)
                     ) -> tuple[str, str | None]:
    """What an unset `comm.dedup_at` becomes, and why when it is `owner` for a reason: `source`
    where this run's codec dedups and its path carries it (the rules `validate_dedup_at` enforces
    on an explicit `source`), else `owner` (reason None when no codec of the run dedups: the key
    then does nothing). `row_wise()`: (row-wise tables, tables that cross the all-to-all) in the
    config's plan, asked last."""
    if not any(c is not None and c.dedups for c in map(find_codec, (codec, *table_codecs.values()))):
        return "owner", None
    blocked = _source_blocker(codec, table_codecs, hierarchy, optimizer, kind)
    reason = None if blocked is None else blocked[1]
    if reason is None and kind == "pooled" and 2 * (rows := row_wise())[0] > rows[1]:
        # Row-wise tables at the source: TorchRec's reduce-scatter sends every owner's (zero)
        # partial of every distinct bag, world size x the distinct rows, where owner-side dedup
        # sends the distinct rows once; rows outweigh ids (dim 128 fp32: 512 B against 8 B), so
        # when most tables are row-wise the output's growth with world size outweighs the ids
        # and lookups saved. A few row-wise tables among table-wise ones stay at the source.
        reason = (f"sharding: {rows[0]} of {rows[1]} tables row-wise: at the "
                  f"source their output sends world size x the distinct rows")
    return ("owner", reason) if reason else ("source", None)


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
