"""LOSSY baselines (TorchRec qcomms fp16 / bf16 / int8) and dedup stacked with fp16 / bf16.

All on real Gloo ranks against `none` with equal weights and batches (ranks.py).
Error bounds for one-hot pooled rows drawn from [-0.5, 0.5):
- fp16 rounds to 11 significant bits: |err| <= 2**-11 * |x| <= 2**-12;
- bf16 to 8 bits: |err| <= 2**-8 * |x| <= 2**-9;
- int8 (fbgemm row-wise over rows of 32 values, fp32 scale and bias):
  |err| <= scale / 2 = (row max - row min) / 510 < 1 / 255.
Stacked dedup+fp16 rounds the same unique rows with the same fbgemm cast, so
its forward equals fp16's bitwise; its bytes are dedup's unique rows at 2 bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dlrmtrain.comm.declarations import available_codecs, lossy_codecs
from dlrmtrain.comm.embeddingbag import CodecEmbeddingBagCollectionSharder
from dlrmtrain.config import ConfigError, load_config
from dlrmtrain.validation import validate_config
from tests.comm.ranks import Scenario, Table, compare_codecs
from tests.comm.test_dedup_training import expected_bytes
from tests.multiproc import run_ranks

MAX_ERR = {"fp16": 2.0 ** -12, "bf16": 2.0 ** -9, "int8": 1 / 255}
WIRE_BYTES_PER_VALUE = {"fp16": 2, "bf16": 2, "int8": 40 / 32}  # int8: 32 values + fp32 scale, bias
LOSS_RTOL = 1e-2  # a few steps at lr 0.1 on losses ~0.69: rounding moves them by ~1e-4

SCENARIO = Scenario(tables=(
    Table("a", 10, 8, ("tw", 0)),
    Table("c", 10, 32, ("cw", (0, 1))),
    Table("d", 20, 16, ("tw", 1), ids="missing"),
    Table("r", 12, 32, ("rw",)),  # row-wise: TorchRec's quantized reduce-scatter / dedup's all-to-all
), batch=16, steps=4, lr=0.1)
CODECS = ("none", "fp16", "bf16", "int8", "dedup+fp16", "dedup+bf16")


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_ranks(compare_codecs, 2, SCENARIO, CODECS, timeout=280)


def forward_error(res: dict, codec: str) -> tuple[float, float]:
    diff = np.abs(res[codec]["pooled"].astype(np.float64) - res["none"]["pooled"])
    return float(diff.max()), float(diff.mean())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("codec", ["fp16", "bf16", "int8"])
def test_lossy_qcomms_train_with_bounded_error(results, codec: str) -> None:
    for rank, res in enumerate(results):
        max_err, mean_err = forward_error(res, codec)
        print(f"rank {rank} {codec}: forward error vs none max {max_err:.3g} mean {mean_err:.3g}")
        assert 0 < mean_err <= max_err <= MAX_ERR[codec], (rank, codec, max_err)
        losses = np.array(res[codec]["losses"])
        assert np.isfinite(losses).all() and len(losses) == SCENARIO.steps
        np.testing.assert_allclose(losses, res["none"]["losses"], rtol=LOSS_RTOL)
        assert not np.array_equal(losses, res["none"]["losses"])  # it really is lossy
        stats = res[codec]["stats"]
        assert stats["lossy_codecs"] == [codec] and "LOSSY codecs " + codec in res[codec]["summary"]
        # row-wise qcomms run inside TorchRec's reduce-scatter without our byte counters
        for t in (t for t in SCENARIO.tables if t.placement[0] != "rw"):
            got = stats["tables"][t.name]
            full = SCENARIO.steps * SCENARIO.batch * t.dim
            assert got["uncompressed_fwd_recv_bytes"] == full * 4
            assert got["payload_fwd_recv_bytes"] == full * WIRE_BYTES_PER_VALUE[codec]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lossy", ["fp16", "bf16"])
def test_dedup_stacked_with_lossy(results, lossy: str) -> None:
    stacked = f"dedup+{lossy}"
    # rows dedup leaves, each at 2 bytes instead of 4: the product of both savings
    expected = expected_bytes(SCENARIO, 2, elem=2)
    for rank, res in enumerate(results):
        # the same rows rounded the same way: forward bitwise that of the lossy codec alone
        assert np.array_equal(res[stacked]["pooled"], res[lossy]["pooled"]), (rank, stacked)
        assert forward_error(res, stacked) == forward_error(res, lossy)
        np.testing.assert_allclose(res[stacked]["losses"], res["none"]["losses"], rtol=LOSS_RTOL)
        stats = res[stacked]["stats"]
        assert stats["lossy_codecs"] == [stacked]
        for t in SCENARIO.tables:
            got = stats["tables"][t.name]
            assert got["codec"] == stacked
            assert got["payload_fwd_recv_bytes"] == expected[rank][t.name]["recv"], (rank, t.name)
            assert got["payload_fwd_sent_bytes"] == expected[rank][t.name]["sent"], (rank, t.name)
            dedup_ratio = got["bags"] / got["unique_bags"]
            copies = 2 if t.placement[0] == "rw" else 1  # a reduce-scatter brings one copy per rank
            assert got["payload_fwd_ratio"] == pytest.approx(2 * copies * dedup_ratio, rel=1e-12)
            assert got["unique_bags"] < got["bags"]  # the scenario repeats ids


FUSED = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}


def test_fp8_on_cpu_is_a_config_time_error() -> None:
    cfg = load_config(None, ["comm.codec=fp8", "run.device=cpu"])
    with pytest.raises(ConfigError, match=r"comm\.codec: lossy codec 'fp8' runs on GPU only"):
        validate_config(cfg, 2)
    with pytest.raises(ValueError, match=r"comm\.codec: lossy codec 'fp8' runs on GPU only"):
        CodecEmbeddingBagCollectionSharder.for_codecs("fp8", {}, FUSED, device_type="cpu")


def test_qcomms_are_run_wide_and_named_lossy() -> None:
    assert set(lossy_codecs()) == {"fp16", "bf16", "int8", "fp8", "dedup+fp16", "dedup+bf16"}
    assert {"none", "dedup"} <= set(available_codecs()) and not {"none", "dedup"} & set(lossy_codecs())
    with pytest.raises(ValueError, match=r"comm\.table_codecs\.t_cat_1: 'int8' is one of TorchRec's"):
        CodecEmbeddingBagCollectionSharder.for_codecs("dedup", {"t_cat_1": "int8"}, FUSED)
    with pytest.raises(ValueError, match=r"comm\.table_codecs\.t_cat_1: comm\.codec='fp16'"):
        CodecEmbeddingBagCollectionSharder.for_codecs("fp16", {"t_cat_1": "none"}, FUSED)
    cfg = load_config(None, ["comm.codec=bf16", "comm.table_codecs={t_cat_2: dedup}", "run.device=cpu"])
    with pytest.raises(ConfigError, match=r"comm\.table_codecs\.t_cat_2"):
        validate_config(cfg, 2)
