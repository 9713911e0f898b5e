"""run.pipeline defaults to `auto`: `sparse_dist` on CUDA (DLRMv4 included, now that its
forward traces), `off` on CPU (issue 26); an explicit choice is kept, and what is refused
stays refused."""

from __future__ import annotations

import pytest

from dlrmtrain.config import load_config
from dlrmtrain.config.loader import ConfigError
from dlrmtrain.validation import resolve_config, resolved_pipeline, validate_config

V4 = ["model.arch=dlrmv4_hstu", "data.source=synthetic_yambda"]


@pytest.mark.parametrize("overrides, device, mode", [
    ([], "cuda", "sparse_dist"),
    ([], "cpu", "off"),
    (V4, "cuda", "sparse_dist"),                      # the HSTU forward traces (issue 27)
    (V4, "cpu", "off"),
    (["run.pipeline=off"], "cuda", "off"),            # an explicit choice is kept
    (["run.pipeline=fused_sparse_dist"], "cpu", "fused_sparse_dist"),
    (["run.pipeline=fused_sparse_dist"], "cuda", "fused_sparse_dist"),  # kept, then refused below
])
def test_auto_resolves_by_device_and_explicit_choices_stay(overrides, device, mode):
    cfg = load_config(None, overrides)
    assert resolved_pipeline(cfg, device) == mode


def test_the_default_is_auto_and_resolve_config_writes_what_runs():
    cfg = load_config(None, ["run.device=cpu"])
    assert cfg.run.pipeline == "auto"
    assert resolve_config(cfg).run.pipeline == "off"
    assert cfg.run.pipeline == "auto"  # the input is unchanged


@pytest.mark.parametrize("overrides, message", [
    (["run.device=cuda", "run.pipeline=fused_sparse_dist"], r"run\.pipeline: fused_sparse_dist runs on CPU only"),
])
def test_refused_combinations_stay_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(load_config(None, overrides), 2)


@pytest.mark.parametrize("overrides, pipeline", [
    (["run.device=cuda"], "sparse_dist"),
    (["run.device=cuda", *V4], "sparse_dist"),
    # fused_sparse_dist on CPU for DLRMv4 too (its refusal was the fused table update's stale
    # rate, fixed for every model: tests/multiproc/test_dlrmv4.py trains it bitwise)
    (["run.device=cpu", "run.pipeline=fused_sparse_dist", *V4], "fused_sparse_dist"),
], ids=["dlrm auto on cuda", "dlrmv4 auto on cuda", "dlrmv4 fused_sparse_dist on cpu"])
def test_auto_on_cuda_passes_validation_for_dlrm_and_dlrmv4(overrides, pipeline):
    cfg = load_config(None, overrides)
    validate_config(cfg, 2)
    assert resolve_config(cfg).run.pipeline == pipeline
