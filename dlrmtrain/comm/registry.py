"""Codec names → codec instances: the implementations of what declarations.py declares.

Lossless: `none`, `dedup`, and `auto` (per all-to-all and table, whichever of
the two measures faster). LOSSY (training differs from `none`): TorchRec's
qcomms `fp16`, `bf16`, `int8`, `fp8` (GPU only), and dedup stacked with a
lossy wire precision, `dedup+fp16`, `dedup+bf16`. The config's choice among them
is checked by codec_choice.py, from the declarations alone (no torch needed).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import torch
from torchrec.distributed.fbgemm_qcomm_codec import CommType

from dlrmtrain.comm.auto.codec import AutoCodec
from dlrmtrain.comm.codec import EmbeddingCommCodec
from dlrmtrain.comm.codecs.lossy import LossyQCommsCodec
from dlrmtrain.comm.codecs.none import NoneCodec
from dlrmtrain.comm.declarations import BUILT_IN, declaration, declare
from dlrmtrain.comm.dedup.codec import DedupCodec
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
assert list(_CODECS) == list(BUILT_IN), "declarations.BUILT_IN must list the codecs built here, in order"
for _codec in _CODECS.values():
    assert _codec.declaration == BUILT_IN[_codec.name], f"{_codec.name}: declared apart from BUILT_IN"


def register_codec(codec: EmbeddingCommCodec) -> None:
    """Register a codec by its name after checking what it declares (declarations.declaration_of),
    and declare it where the config check reads it: what the table above does for the built-in
    ones (a codec in the package adds itself there, its facts to declarations.BUILT_IN and its
    name to config.schema.CodecName)."""
    declared = codec.declaration
    if (codec.qcomms_config() is not None) != declared.qcomms:
        raise TypeError(f"codec {codec.name!r}: qcomms must say whether qcomms_config gives TorchRec's config")
    declare(declared)
    _CODECS[codec.name] = codec


def run_codecs(names: Iterable[str], auto: AutoConfig | None = None) -> dict[str, EmbeddingCommCodec]:
    """The codec a run's all-to-alls use for each of `names`: the registered one as the run uses
    it (`EmbeddingCommCodec.for_run`: with the run's `comm.auto`; None: the defaults)."""
    return {n: get_codec(n).for_run(auto) for n in names}


def get_codec(name: str, where: str = "comm.codec") -> EmbeddingCommCodec:
    """The codec called `name`; `where` names the config key in the error."""
    declaration(name, where)  # an unknown name: the error names `where`
    return _CODECS[name]


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
    return codec is not None and codec.qcomms


def codecs_per_table(codec: str, table_codecs: Mapping[str, str], tables: Iterable[str]) -> dict[str, str]:
    """Codec name for every table: the per-table override, else the run's codec."""
    tables = list(tables)
    unknown = sorted(set(table_codecs) - set(tables))
    if unknown:
        raise ValueError(f"comm.table_codecs names tables the model does not have: {unknown}; "
                         f"tables are {sorted(tables)}")
    return {t: table_codecs.get(t, codec) for t in tables}
