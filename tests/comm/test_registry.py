"""Codec names, config validation and what make_ebc_sharder returns."""

from __future__ import annotations

import pytest
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

from dlrmtrain.comm.registry import available_codecs, codecs_per_table
from dlrmtrain.comm.sharder import CodecEmbeddingBagCollectionSharder, make_ebc_sharder

FUSED = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}


def test_available_codecs() -> None:
    assert available_codecs() == ["auto", "bf16", "dedup", "dedup+bf16", "dedup+fp16", "fp16", "fp8", "int8", "none"]


def test_none_everywhere_is_torchrecs_stock_sharder() -> None:
    sharder = make_ebc_sharder("none", {}, FUSED)
    assert type(sharder) is EmbeddingBagCollectionSharder
    assert sharder.fused_params == FUSED
    assert type(make_ebc_sharder("none", {"t_cat_0": "none"}, FUSED)) is EmbeddingBagCollectionSharder


def test_dedup_or_any_table_override_gives_the_codec_sharder() -> None:
    assert isinstance(make_ebc_sharder("dedup", {}, FUSED), CodecEmbeddingBagCollectionSharder)
    sharder = make_ebc_sharder("none", {"t_cat_3": "dedup"}, FUSED)
    assert isinstance(sharder, CodecEmbeddingBagCollectionSharder)
    assert sharder.fused_params == FUSED


def test_unknown_codec_names_the_config_key() -> None:
    with pytest.raises(ValueError, match=r"comm\.codec: unknown codec 'zip'"):
        make_ebc_sharder("zip", {}, FUSED)
    with pytest.raises(ValueError, match=r"comm\.table_codecs\.t_cat_1: unknown codec 'gz'"):
        make_ebc_sharder("dedup", {"t_cat_1": "gz"}, FUSED)


def test_per_table_choice_and_unknown_tables() -> None:
    assert codecs_per_table("dedup", {"b": "none"}, ["a", "b"]) == {"a": "dedup", "b": "none"}
    with pytest.raises(ValueError, match=r"tables the model does not have: \['zz'\]"):
        codecs_per_table("dedup", {"zz": "none"}, ["a", "b"])
