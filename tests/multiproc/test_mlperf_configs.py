"""The MLPerf configs start on CPU with their tables scaled down and train."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrmtrain.config import load_config
from dlrmtrain.validation import resolve_config, validate_config
from tests.multiproc import ranks_once_per_module

REPO = Path(__file__).resolve().parents[2]
SMALL = ["run.device=cpu", "model.max_table_rows=2000", "run.global_batch_size=256",
         "run.max_steps=3", "eval.batch_size=1024", "data.synthetic.num_train_samples=2048",
         "data.synthetic.num_eval_samples=1024", "logging.progress_bar=false",
         "logging.metrics_every_steps=1"]


def _run_config(rank, world_size, path, overrides):
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.trainer import Trainer

    cfg = resolve_config(load_config(path, overrides))
    validate_config(cfg, world_size)
    trainer = Trainer(cfg, init_distributed("cpu"))
    summary = trainer.train().as_dict()
    n_params = sum(p.numel() for n, p in trainer.model.named_parameters() if "embedding" not in n)
    trainer.close()
    del trainer
    return summary, n_params


# Bottom 13-512-256-128, top 479-1024-1024-512-256-1 (MLPerf v1 sizes).
V1_DENSE_PARAMS = ((13 * 512 + 512) + (512 * 256 + 256) + (256 * 128 + 128)
                   + (479 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 512 + 512)
                   + (512 * 256 + 256) + (256 + 1))


# Same MLPs, cross net 3 × (3456·512 + 512·3456 + 3456) on 27·128 inputs, top on 3456.
DCNV2_DENSE_PARAMS = ((13 * 512 + 512) + (512 * 256 + 256) + (256 * 128 + 128)
                      + 3 * (3456 * 512 * 2 + 3456)
                      + (3456 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 512 + 512)
                      + (512 * 256 + 256) + (256 + 1))
DENSE_PARAMS = {"mlperf_v1_terabyte": V1_DENSE_PARAMS, "mini_mlperf_dim128": V1_DENSE_PARAMS,
                "mlperf_dcnv2": DCNV2_DENSE_PARAMS}


def _run_every_config(rank, world_size, out_dir):
    """Every config in one spawned group: a spawn costs as much as one of these runs."""
    return {name: _run_config(rank, world_size, str(REPO / "configs" / f"{name}.yaml"),
                              SMALL + [f"run.output_dir={out_dir}"])
            for name in DENSE_PARAMS}


trained = ranks_once_per_module(_run_every_config, "mlperf_configs", timeout=500)


@pytest.mark.parametrize("name", list(DENSE_PARAMS))
def test_mlperf_config_trains_scaled_down(trained, name):
    runs, out = trained
    summary, n_params = runs[name]
    assert summary["steps"] == 3
    assert summary["final_auc"] is not None
    assert n_params == DENSE_PARAMS[name]
    log = (out / name / "mlperf.log").read_text()  # the configs log MLPerf events
    assert log.count('"key": "run_start"') == 1 and '"key": "eval_accuracy"' in log


def test_mini_mlperf_dim128_is_mlperf_shaped():
    """Embedding dim 128, MLPerf v1 MLPs, local batch 4096 on 2 ranks, the calibrated
    kaggle profile, the v1 SGD schedule and a target: what bench_link and the runner use."""
    cfg = load_config(REPO / "configs" / "mini_mlperf_dim128.yaml")
    validate_config(cfg, 2)
    assert cfg.run.global_batch_size // 2 == 4096
    assert (cfg.model.arch, cfg.model.embedding_dim) == ("dlrm_v1", 128)
    assert (cfg.model.bottom_mlp, cfg.model.top_mlp) == ([512, 256, 128], [1024, 1024, 512, 256, 1])
    assert (cfg.data.source, cfg.data.synthetic.profile) == ("synthetic", "kaggle")
    assert cfg.optim.name == "sgd" and cfg.optim.warmup_steps and cfg.optim.decay_steps
    assert cfg.eval.target_auc is not None and cfg.mlperf.enabled
