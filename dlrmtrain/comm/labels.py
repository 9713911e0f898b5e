"""`<codec>/node`: one run's codec and hierarchy as one label (the MLPerf runner's --codecs,
bench_comm's --codec, the report's legend); the placement's config key. Torch-free, so the
report and the run identity can use it."""

from __future__ import annotations

from typing import get_args

from dlrmtrain.config.schema import CodecName, HierarchyKind

CODEC_NAMES: tuple[str, ...] = get_args(CodecName)
"""every name `comm.codec` takes (declarations.BUILT_IN declares exactly these)"""

PLACEMENT_KEY = "comm.dedup_at"
"""the config key naming where a deduping codec runs (comm/placement_choice.py: `owner`, or `source`:
the sample side); torch-free, for the run identity"""


def contender_label(codec: str, hierarchy: HierarchyKind = "flat") -> str:
    """`dedup` flat, `dedup/node` over two levels."""
    return codec + ("/node" if hierarchy == "node" else "")


def parse_contender(label: str) -> tuple[str, HierarchyKind]:
    """(codec, hierarchy) of `contender_label`'s output; a clear error for another shape. The codec
    name is checked where it is used (`comm.codec`, a checked name: its error names the key)."""
    codec, slash, kind = label.partition("/")
    if not codec or (slash and kind != "node"):
        raise ValueError(f"{label!r} is neither a codec nor <codec>/node (two levels)")
    return codec, "node" if slash else "flat"
