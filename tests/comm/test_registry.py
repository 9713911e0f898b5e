"""Codec names, config validation and what the owner side's sharders (`for_codecs`) return."""

from __future__ import annotations

import pytest
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from dlrmtrain.comm.declarations import available_codecs
from dlrmtrain.comm.registry import codecs_per_table
from dlrmtrain.comm.embeddingbag import CodecEmbeddingBagCollectionSharder

FUSED = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
pooled_sharder = CodecEmbeddingBagCollectionSharder.for_codecs
"""the owner side's pooled sharder for a run's codec choice"""


def test_available_codecs() -> None:
    assert available_codecs() == ["auto", "bf16", "dedup", "dedup+bf16", "dedup+fp16", "fp16", "fp8", "int8", "none"]


def test_none_everywhere_is_torchrecs_stock_sharder() -> None:
    sharder = pooled_sharder("none", {}, FUSED)
    assert type(sharder) is EmbeddingBagCollectionSharder
    assert sharder.fused_params == FUSED
    assert type(pooled_sharder("none", {"t_cat_0": "none"}, FUSED)) is EmbeddingBagCollectionSharder


def test_dedup_or_any_table_override_gives_the_codec_sharder() -> None:
    assert isinstance(pooled_sharder("dedup", {}, FUSED), CodecEmbeddingBagCollectionSharder)
    sharder = pooled_sharder("none", {"t_cat_3": "dedup"}, FUSED)
    assert isinstance(sharder, CodecEmbeddingBagCollectionSharder)
    assert sharder.fused_params == FUSED


def test_unknown_codec_names_the_config_key() -> None:
    with pytest.raises(ValueError, match=r"comm\.codec: unknown codec 'zip'"):
        pooled_sharder("zip", {}, FUSED)
    with pytest.raises(ValueError, match=r"comm\.table_codecs\.t_cat_1: unknown codec 'gz'"):
        pooled_sharder("dedup", {"t_cat_1": "gz"}, FUSED)


def test_per_table_choice_and_unknown_tables() -> None:
    assert codecs_per_table("dedup", {"b": "none"}, ["a", "b"]) == {"a": "dedup", "b": "none"}
    with pytest.raises(ValueError, match=r"tables the model does not have: \['zz'\]"):
        codecs_per_table("dedup", {"zz": "none"}, ["a", "b"])


def test_the_schema_names_exactly_the_registered_codecs() -> None:
    """`comm.codec` is a checked name: the loader refuses what the registry does not know."""
    from dlrmtrain.comm.labels import CODEC_NAMES

    assert sorted(CODEC_NAMES) == available_codecs()


def test_codec_labels_round_trip_and_refuse_other_shapes() -> None:
    from dlrmtrain.comm.labels import contender_label, parse_contender

    for codec in available_codecs():
        for kind in ("flat", "node"):
            assert parse_contender(contender_label(codec, kind)) == (codec, kind)
    assert contender_label("dedup", "node") == "dedup/node" and contender_label("none") == "none"
    for bad in ("dedup/rack", "/node", ""):
        with pytest.raises(ValueError, match="neither a codec nor <codec>/node"):
            parse_contender(bad)


def test_the_builders_refuse_what_the_hierarchy_cannot_carry() -> None:
    """Each sharder builder checks the hierarchy itself, not only config validation before it."""
    from dlrmtrain.comm.embedding import CodecEmbeddingCollectionSharder
    from dlrmtrain.comm.topology import Hierarchy

    node = Hierarchy("node", 2)
    with pytest.raises(ValueError, match=r"comm\.hierarchy: node covers pooled embeddings only"):
        CodecEmbeddingCollectionSharder.for_codecs("dedup", {}, FUSED, hierarchy=node)
    with pytest.raises(ValueError, match=r"comm\.codec: 'fp16' cannot run under comm\.hierarchy: node"):
        pooled_sharder("fp16", {}, FUSED, hierarchy=node)
    assert isinstance(pooled_sharder("dedup", {}, FUSED, hierarchy=node), CodecEmbeddingBagCollectionSharder)


def test_a_codec_declares_where_it_runs_nothing_is_derived_from_lossless():
    """A lossless codec that leaves `dedups`, `sides` or `runs_under_two_levels` unsaid is refused
    at registration (it was once accepted under two levels because it was lossless)."""
    import torch.nn as nn

    from dlrmtrain.comm.codec import EmbeddingCommCodec
    from dlrmtrain.comm.registry import register_codec

    class Undeclared(EmbeddingCommCodec):
        name, lossless = "undeclared", True

        def supports(self, sharding_type, kind="pooled") -> bool:
            return True

        def make_output_dist(self, spec) -> nn.Module:
            return spec.stock_dist

    with pytest.raises(TypeError, match="must declare dedups, sides, runs_under_two_levels"):
        register_codec(Undeclared())
    assert "undeclared" not in available_codecs()
    Undeclared.dedups, Undeclared.sides, Undeclared.runs_under_two_levels = False, frozenset({"middle"}), False
    with pytest.raises(TypeError, match="sides must be a non-empty set of 'owner' and 'sample'"):
        register_codec(Undeclared())
