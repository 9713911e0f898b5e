"""Codec names → codec instances, and the per-table codec choice from config."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dlrmtrain.comm.codec import EmbeddingCommCodec
from dlrmtrain.comm.codecs.dedup import DedupCodec
from dlrmtrain.comm.codecs.none import NoneCodec

_CODECS: dict[str, EmbeddingCommCodec] = {c.name: c for c in (NoneCodec(), DedupCodec())}


def available_codecs() -> list[str]:
    """Names accepted by `comm.codec` and `comm.table_codecs` (config validation uses this)."""
    return sorted(_CODECS)


def get_codec(name: str, where: str = "comm.codec") -> EmbeddingCommCodec:
    """The codec called `name`; `where` names the config key in the error."""
    try:
        return _CODECS[name]
    except KeyError:
        raise ValueError(f"{where}: unknown codec {name!r}; available: {available_codecs()}") from None


def validate_codec_choice(codec: str, table_codecs: Mapping[str, str]) -> None:
    """Reject unknown codec names before anything is built."""
    get_codec(codec, "comm.codec")
    for table, name in table_codecs.items():
        get_codec(name, f"comm.table_codecs.{table}")


def codecs_per_table(codec: str, table_codecs: Mapping[str, str], tables: Iterable[str]) -> dict[str, str]:
    """Codec name for every table: the per-table override, else the run's codec."""
    tables = list(tables)
    unknown = sorted(set(table_codecs) - set(tables))
    if unknown:
        raise ValueError(f"comm.table_codecs names tables the model does not have: {unknown}; "
                         f"tables are {sorted(tables)}")
    return {t: table_codecs.get(t, codec) for t in tables}
