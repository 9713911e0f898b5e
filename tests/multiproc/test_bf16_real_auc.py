"""bf16 reaches fp32's AUC on the real Criteo sample (issue 44, item 3), DLRM v1 and DCNv2
shapes: a short 2-rank run of configs/mini_mlperf.yaml under each precision, same seed, same
batches, AUC over the same 9,857 held-out rows. The full runs (v1 to the end of its schedule,
DCNv2 one epoch) and mini_dlrmv4's are figures in docs/performance.md ("Mixed precision")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.common import train_on_rank
from tests.data.raw_rows import REPO_ROOT, shared_data_dir
from tests.multiproc import run_ranks

CONFIG = REPO_ROOT / "configs" / "mini_mlperf.yaml"
SAMPLE = shared_data_dir() / "criteo_kaggle_sample.tsv.gz"

SHORT = ["run.max_steps=40", "eval.evals_per_epoch=0", "eval.target_auc=null",
         "mlperf.enabled=false", "logging.metrics_every_steps=1000"]
# Adagrad at a constant rate (MLPerf DCNv2's optimizer) for both: in 40 steps SGD barely moves
# the tables (v1 at lr 0.25, seed 0: 0.629, and within 0.001 of that with the tables'
# gradients cut; DCNv2 stays near chance), so it would compare the dense part alone.
ADAGRAD = ["optim.name=adagrad", "optim.lr=0.005", "optim.warmup_steps=0",
           "optim.decay_start_step=0", "optim.decay_steps=0"]
SHAPES = {"dlrm_v1": ADAGRAD,
          "dlrm_dcnv2": ["model.arch=dlrm_dcnv2", "model.dcn_low_rank_dim=32", *ADAGRAD]}
# |bf16 - fp32| allowed. The same short runs at seeds 0-4 (2026-12-07, AVX2 EPYC) differed by
# at most 9.6e-4 (v1, mean -2e-4) and 1.4e-3 (DCNv2, mean +5e-4), both signs: no bias. Adagrad
# divides each gradient by its own running size, so a first gradient near zero steps by a full
# lr whichever way bf16's 2**-9 rounding leaves it: the rounding is amplified with the rate (at
# lr 0.01 DCNv2 differed by up to 3.6e-3, at 0.02 by 8.6e-3; the full runs' spread is in
# docs/performance.md). 0.003 is 2x the largest measured. Tables that get no gradient under bf16
# lose 0.022 (v1) and 0.027 (DCNv2) here.
TOLERANCE = 0.003
LEARNED = 0.65   # fp32 reaches 0.71-0.73 (both shapes) here; chance is 0.5
PRECISIONS = ("fp32", "bf16")


def short_run_overrides(data_path: str, out_dir: str, shape: str, precision: str, seed: int = 0) -> list[str]:
    """One short run of the comparison (the seeds above were measured with these)."""
    return [f"data.path={data_path}", f"run.output_dir={out_dir}/{shape}_{precision}",
            f"run.seed={seed}", f"precision.mode={precision}", *SHORT, *SHAPES[shape]]


def _each_run(rank: int, world_size: int, data_path: str, out_dir: str) -> dict:
    """Every run in one spawned group: a spawn and its imports cost as much as a run."""
    return {(shape, precision): train_on_rank(rank, world_size, str(CONFIG),
                                              short_run_overrides(data_path, out_dir, shape, precision))["final_auc"]
            for shape in SHAPES for precision in PRECISIONS}


@pytest.mark.skipif(not SAMPLE.is_file(),
                    reason=f"real Criteo sample not found at {SAMPLE} (set DLRMTRAIN_SHARED_DATA)")
def test_bf16_reaches_fp32s_auc_on_the_real_sample(tmp_path: Path):
    from dlrmtrain.data.preprocess.pipeline import preprocess

    preprocess([SAMPLE], tmp_path / "prep", "mlperf_vocab", progress=False)
    aucs, _ = run_ranks(_each_run, 2, str(tmp_path / "prep"), str(tmp_path / "runs"), timeout=600)
    for shape in SHAPES:
        fp32, bf16 = aucs[(shape, "fp32")], aucs[(shape, "bf16")]
        assert fp32 > LEARNED, (shape, fp32)  # both learned: a comparison near chance says nothing
        assert bf16 == pytest.approx(fp32, abs=TOLERANCE), (shape, fp32, bf16)
