"""What each codec declares about itself, torch-free: the facts the config check reads.

A codec's implementation (codec.py's `EmbeddingCommCodec`, registered by registry.py) needs
torch and TorchRec; what config validation asks of it does not: its name, whether it is
lossless, whether it dedups, where it may run, whether it runs under two levels, whether it
is one of TorchRec's quantized comms and whether it runs on GPU only. The built-in codecs'
answers are written once here (`BUILT_IN`); each built-in codec class takes its own from this
table (`EmbeddingCommCodec.declare`), and a codec registered later adds its own
(`registry.register_codec` → `declare`). So `dlrmtrain train` checks a config in the
launching process without importing TorchRec (tests/config/test_validation_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from dlrmtrain.comm.labels import CODEC_NAMES

CollectionKind = Literal["pooled", "sequence"]
"""what an all-to-all carries: pooled rows (EmbeddingBagCollection) or one row per id (EmbeddingCollection)"""

Side = Literal["owner", "sample"]
"""where a codec's work on an all-to-all runs: at the `owner` (its output dist, after the id
all-to-all) or on the `sample` side (where the batch is made; TorchRec's stock dists carry what
it made): comm/placement_choice.py"""

SIDES: frozenset[Side] = frozenset({"owner", "sample"})

DECLARED = ("name", "lossless", "dedups", "sides", "runs_under_two_levels")
"""what every codec declares itself (no defaults: `declaration_of`, asked at registration)"""


@dataclass(frozen=True)
class CodecDeclaration:
    """One codec's facts (the fields of `DECLARED` have no default: each codec says them)."""

    name: str
    """the name used in config (`comm.codec`, `comm.table_codecs`)"""
    lossless: bool
    """True when training is the same as without the codec (up to float summation order)"""
    dedups: bool
    """True when it finds distinct rows (a run's unset placement is resolved only where one does)"""
    sides: frozenset[Side]
    """where its tables may travel (`Side`): "owner" through its output dist; "sample" where the
    batch is made (`none`: its tables travel whole either way)"""
    runs_under_two_levels: bool
    """whether it may be a table's codec under `comm.hierarchy: node` (two-level dists, or a table
    that travels whole); a lossy wire would round twice on the way"""
    qcomms: bool = False
    """True when it is one of TorchRec's quantized comms (`EmbeddingCommCodec.qcomms_config`),
    which apply to the whole all-to-all: the run's codec only, no per-table override"""
    gpu_only: str | None = None
    """why it cannot run off a GPU; None: it runs on every device"""
    whole_beside_at_sample: frozenset[CollectionKind] = field(default_factory=frozenset)
    """the collection kinds on which, at the sample side, tables whose codec does not dedup
    travel whole beside this codec's (pooled: their features keep their bags); on the others
    every table of the collection takes the run's codec"""

    def __post_init__(self) -> None:
        if not self.sides or set(self.sides) - SIDES:
            raise TypeError(f"codec {self.name!r}: sides must be a non-empty set of 'owner' and 'sample', "
                            f"got {sorted(self.sides)}")


def declaration_of(codec: Any) -> CodecDeclaration:
    """The declaration of a codec object, read from its attributes; refuses one that leaves one of
    `DECLARED` to a default: where it may run and whether it dedups or runs under two levels are
    its own to say, never derived (from `lossless`)."""
    missing = [a for a in DECLARED if not hasattr(codec, a)]
    if missing:
        raise TypeError(f"codec {type(codec).__name__} must declare {', '.join(missing)} "
                        f"(comm/README.md, \"Adding a codec\")")
    return CodecDeclaration(**{f.name: getattr(codec, f.name) for f in fields(CodecDeclaration)
                               if hasattr(codec, f.name)})


_EXACT_DEDUP = dict(lossless=True, dedups=True, sides=SIDES, runs_under_two_levels=True,
                    whole_beside_at_sample=frozenset({"pooled"}))
"""`dedup`'s facts, and `auto`'s (none or dedup per all-to-all at the owner, per batch at the sample
side; its sample side is dedup's)"""
_STACKED_DEDUP = dict(lossless=False, dedups=True, sides=frozenset({"owner"}), runs_under_two_levels=False)
"""dedup stacked with a lossy wire: it rounds on the owner's wire, at the owner only, one level (a
second level would round again)"""
_QCOMMS = dict(lossless=False, dedups=False, sides=frozenset({"owner"}), runs_under_two_levels=False,
               qcomms=True)
"""TorchRec's qcomms quantize inside the stock output dist; a second level would round again"""

BUILT_IN: dict[str, CodecDeclaration] = {d.name: d for d in (
    # its tables travel whole through the stock dist either way, and under two-level dedup
    CodecDeclaration("none", lossless=True, dedups=False, sides=SIDES, runs_under_two_levels=True),
    CodecDeclaration("dedup", **_EXACT_DEDUP),
    CodecDeclaration("auto", **_EXACT_DEDUP),
    CodecDeclaration("dedup+fp16", **_STACKED_DEDUP),
    CodecDeclaration("dedup+bf16", **_STACKED_DEDUP),
    CodecDeclaration("fp16", **_QCOMMS),
    CodecDeclaration("bf16", **_QCOMMS),
    CodecDeclaration("int8", **_QCOMMS),
    CodecDeclaration("fp8", **_QCOMMS, gpu_only="fbgemm has no CPU fp8 quantize kernel"),
)}
"""the codecs of the package, in registration order (registry.py implements each)"""
assert sorted(BUILT_IN) == sorted(CODEC_NAMES), "config.schema.CodecName must list the built-in codecs"

_DECLARED: dict[str, CodecDeclaration] = dict(BUILT_IN)
"""name → declaration of every codec: the built-in ones and those registered since"""


def declare(declaration: CodecDeclaration) -> None:
    """Add a registered codec's declaration (registry.register_codec)."""
    if declaration.name in _DECLARED:
        raise ValueError(f"a codec named {declaration.name!r} is registered already")
    _DECLARED[declaration.name] = declaration


def find_declaration(name: str) -> CodecDeclaration | None:
    """What the codec called `name` declares, None when none is."""
    return _DECLARED.get(name)


def declaration(name: str, where: str = "comm.codec") -> CodecDeclaration:
    """What the codec called `name` declares; `where` names the config key in the error."""
    try:
        return _DECLARED[name]
    except KeyError:
        raise ValueError(f"{where}: unknown codec {name!r}; available: {available_codecs()}") from None


def codecs_that(holds: Callable[[CodecDeclaration], bool]) -> list[str]:
    """The names of the codecs for which `holds(declaration)`, in registration order."""
    return [name for name, d in _DECLARED.items() if holds(d)]


def available_codecs() -> list[str]:
    """Names accepted by `comm.codec` and `comm.table_codecs` (config validation uses this)."""
    return sorted(_DECLARED)


def lossy_codecs() -> list[str]:
    """The names among `available_codecs()` that change what the model trains on."""
    return sorted(codecs_that(lambda d: not d.lossless))
