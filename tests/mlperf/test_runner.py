"""The MLPerf runner: real torchrun launches into the results layout, checked and scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlrmtrain.config.loader import dump_config, load_config
from dlrmtrain.mlperf.compliance import ComplianceResult, check_log, rcp_verdict
from dlrmtrain.mlperf.scoring import RunTime, olympic_score
from dlrmtrain.mlperf_runner import (
    CodecOutcome,
    dlrmv4_scale,
    expected_eval_samples,
    expected_train_samples,
    main,
    ratios_to_first,
    speedup,
    write_summary,
)
from tests.common import tiny_config
from tests.mlperf.test_trainer_mlperf_log import MLPERF_SHAPE, RUN, TARGET


def _eval_aucs(result_file: Path) -> list[float]:
    return [json.loads(line.split(" ", 1)[1])["value"] for line in result_file.read_text().splitlines()
            if '"key": "eval_accuracy"' in line]


def test_runner_writes_checks_and_scores_seeded_runs_per_codec(tmp_path):
    config = tmp_path / "tiny_mlperf.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *MLPERF_SHAPE, *RUN,
                            "model.arch=dlrm_dcnv2", "optim.lr=0.1"), config)
    out = tmp_path / "submission"

    code = main(["--config", str(config), "--out", str(out), "--codecs", "none,dedup",
                 "--runs", "2", "--timeout-min", "4"])

    summary = json.loads((out / "summary.json").read_text())
    assert summary["unofficial"] and summary["benchmark"] == "dlrm_dcnv2"
    assert Path(summary["rules"]).parent == out / "rules" / "training_6.0.0"
    for codec in ("none", "dedup"):
        system = f"cpu2_gloo_codec-{codec}"
        assert (out / "systems" / f"{system}.json").is_file()
        results = sorted((out / "results" / system / "dlrm_dcnv2").glob("result_*.txt"))
        assert [r.name for r in results] == ["result_0.txt", "result_1.txt"]
        # Each run's checker verdict agrees with what the trainer itself saw (seeds 0 and 1).
        scored = summary["codecs"][codec]
        for index, failed in enumerate(scored["failed_rules"]):
            run_dir = out / "runs" / system / f"run{index}_seed{index}"
            reached = json.loads((run_dir / "summary.json").read_text())["reached_target"]
            assert (failed == []) is reached, (codec, index, failed)
            assert failed in ([], ["eval_accuracy"])
        # The score is the olympic mean of the logged times.
        runs = [RunTime(f"r{i}", m) for i, m in enumerate(scored["run_minutes"])]
        assert scored["score_minutes"] == olympic_score("dlrm_dcnv2", runs).minutes
        # evaluation's share of the wall time is read from the logs; no RCP under derived rules
        assert 0 < scored["eval_share"] < 1 and scored["rcp"] is None
    # dedup is lossless: the same seed evaluates to the same AUCs up to float summation order.
    # That order can swap a pair of near-tied predictions after some steps, and on this small
    # eval set one swapped (positive, negative) pair moves the AUC by ~5e-4 (1 / (P·N)):
    # allow a few such swaps, far below what a real difference in training shows.
    for index in range(2):
        none, dedup = (_eval_aucs(out / "results" / f"cpu2_gloo_codec-{c}" / "dlrm_dcnv2" /
                                  f"result_{index}.txt") for c in ("none", "dedup"))
        assert dedup == pytest.approx(none, abs=2e-3)
    # Seed 0 of codec none is the dcnv2 run of tests/mlperf/test_trainer_mlperf_log.py: its log
    # reached the small target, passes the derived rules cleanly, and fails the official ones on
    # exactly the accuracy target and the eval size.
    log = out / "results" / "cpu2_gloo_codec-none" / "dlrm_dcnv2" / "result_0.txt"
    assert TARGET <= max(_eval_aucs(log)) < 0.8025
    assert sum('"key": "run_start"' in line for line in log.read_text().splitlines()) == 1
    derived = check_log(log, "6.0.0", Path(summary["rules"]))
    assert derived.passed and not derived.warnings, (derived.failures, derived.warnings)
    assert check_log(log, "6.0.0").failed_keys == {"eval_accuracy", "eval_samples"}
    # The official RCP checker on this folder: DCNv2's RCPs start at batch 32768, so a small
    # batch that converges this fast has no reference point to be held to.
    rcp = rcp_verdict(out / "results" / "cpu2_gloo_codec-none" / "dlrm_dcnv2", "dlrm_dcnv2", "6.0.0")
    assert rcp is not None and not rcp.passed
    assert rcp.message in ("Insufficient convergence", "Missing RCP, please submit RCP with BS = 64",
                           "Cannot find any RCPs") or rcp.message.startswith("Missing RCP"), rcp
    # The runner draws every run: one report row per (codec, seed), and the AUC plot.
    report = (out / "report" / "report.md").read_text()
    assert sum(line.startswith(("| run0_", "| run1_")) for line in report.splitlines()) == 4
    assert (out / "report" / "auc.png").stat().st_size > 0
    both_scored = all(summary["codecs"][c]["score_minutes"] is not None for c in ("none", "dedup"))
    assert code == (0 if both_scored else 1)
    if both_scored:
        assert summary["ratio_first_over_second"] == pytest.approx(
            summary["codecs"]["none"]["score_minutes"] / summary["codecs"]["dedup"]["score_minutes"])


def test_unknown_codec_is_refused_before_any_launch(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *MLPERF_SHAPE, *RUN), config)
    code = main(["--config", str(config), "--out", str(tmp_path / "out"), "--codecs", "none,zip9"])
    assert code == 2
    assert "comm.codec" in capsys.readouterr().err
    assert not (tmp_path / "out" / "results").exists()


def test_codec_slash_node_runs_that_codec_over_two_levels(tmp_path):
    """`--codecs none,dedup/node`: the two-level contender gets comm.hierarchy=node and a system
    name without a slash; anything else after the slash is refused before any launch."""
    from dlrmtrain.mlperf_runner import parse_args, plan_from_args, run_command

    config = tmp_path / "tiny.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *MLPERF_SHAPE, *RUN), config)
    plan = plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "out"),
                                      "--codecs", "none,dedup/node"]))
    two_level, flat = run_command(plan, "dedup/node", 0), run_command(plan, "none", 0)
    assert {"comm.codec=dedup", "comm.hierarchy=node"} <= set(two_level)
    assert "comm.codec=none" in flat and not any(a.startswith("comm.hierarchy") for a in flat)
    assert plan.system("dedup/node") == "cpu2_gloo_codec-dedup-node"
    with pytest.raises(SystemExit, match="--codecs: 'dedup/rack' is neither"):
        plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "o2"),
                                   "--codecs", "none,dedup/rack"]))


def test_precisions_run_every_codec_under_each_and_name_them_apart(tmp_path):
    """`--precisions fp32,bf16`: each codec under each precision.mode, systems named apart;
    a precision that precision.mode does not take, or one given twice, refused before a launch."""
    from dlrmtrain.mlperf_runner import parse_args, plan_from_args, run_command, series_plan

    config = tmp_path / "tiny.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *MLPERF_SHAPE, *RUN), config)
    plan = plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "out"),
                                      "--codecs", "none,dedup", "--precisions", "fp32,bf16"]))
    assert plan.codecs == ("none@fp32", "dedup@fp32", "none@bf16", "dedup@bf16")
    assert series_plan(plan)["codecs"] == list(plan.codecs)  # a re-run with other precisions is refused
    amp = run_command(plan, "dedup@bf16", 0)
    assert {"comm.codec=dedup", "precision.mode=bf16"} <= set(amp)
    assert "precision.mode=fp32" in run_command(plan, "none@fp32", 0)
    assert plan.system("dedup@bf16") == "cpu2_gloo_codec-dedup_bf16"
    assert len({plan.system(c) for c in plan.codecs}) == 4
    for bad, match in ((["--precisions", "fp32,fp16"], "--precisions fp32,fp16: each of fp32, bf16"),
                       (["--precisions", "bf16,bf16"], "at most once"),
                       (["--codecs", "none@bf16", "--precisions", "fp32"], "not both"),
                       (["--codecs", "none,dedup@fp8"], "'fp8' after '@' is not a precision")):
        with pytest.raises(SystemExit, match=match):
            plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "o2"), *bad]))
    assert not (tmp_path / "o2").exists()


def test_ratios_are_taken_within_each_precision_and_printed_side_by_side(tmp_path):
    from dlrmtrain.mlperf_runner import parse_args, plan_from_args, render_summary

    config = tmp_path / "tiny.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *MLPERF_SHAPE, *RUN), config)
    plan = plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "out"),
                                      "--codecs", "none,dedup,auto", "--precisions", "fp32,bf16",
                                      "--runs", "5"]))
    outcomes = [_outcome("none@fp32", *[12.0] * 5), _outcome("dedup@fp32", *[6.0] * 5),
                _outcome("auto@fp32", *[8.0] * 5), _outcome("none@bf16", *[9.0] * 5),
                _outcome("dedup@bf16", *[6.0] * 5), _outcome("auto@bf16", None, None, 5.0, 5.0, 5.0)]
    text = render_summary(plan, outcomes)
    assert "    codec            fp32     bf16" in text
    assert "    dedup           2.000    1.500" in text  # 12 / 6 under fp32, 9 / 6 under bf16
    assert "    auto            1.500        -" in text  # two non-converged bf16 runs: no score
    assert "fp32 / bf16 time to train per codec (>1: bf16 is faster): none 1.333, dedup 1.000" in text
    plan.out.mkdir()
    summary = json.loads(write_summary(plan, outcomes).read_text())
    assert summary["ratios_by_precision"] == {"fp32": {"dedup": 2.0, "auto": 1.5}, "bf16": {"dedup": 1.5}}
    assert summary["fp32_over_bf16"] == pytest.approx({"none": 12 / 9, "dedup": 1.0})


def _outcome(codec: str, *minutes: float | None) -> CodecOutcome:
    runs = [RunTime(f"result_{i}.txt", m) for i, m in enumerate(minutes)]
    return CodecOutcome(codec, olympic_score("dlrm", runs), tuple[ComplianceResult, ...]())


def test_ratio_is_first_codec_score_over_second():
    none = _outcome("none", 10.0, 12.0, 11.0, 13.0, 14.0)    # score 12
    dedup = _outcome("dedup", 7.0, 8.0, 9.0, 10.0, 6.0)      # score 8
    assert speedup([none, dedup]) == pytest.approx(1.5)
    failed = _outcome("dedup", 7.0, None, None, 10.0, 6.0)   # two non-converged: no score
    assert speedup([none, failed]) is None
    auto = _outcome("auto", 5.0, 6.0, 6.0, 6.0, 7.0)        # score 6
    assert ratios_to_first([none, dedup, failed, auto]) == pytest.approx({"dedup": 1.5, "auto": 2.0})
    assert ratios_to_first([failed, none]) == {}              # no baseline score: no ratio


def test_link_gbit_puts_every_run_behind_its_own_shaped_link(tmp_path):
    from dlrmtrain.testbed.shaped_link import unavailable_reason
    from dlrmtrain.mlperf_runner import parse_args, plan_from_args, run_command

    config = tmp_path / "tiny.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *MLPERF_SHAPE, *RUN), config)
    args = parse_args(["--config", str(config), "--out", str(tmp_path / "out"),
                       "--link-gbit", "1"])
    reason = unavailable_reason()
    if reason:  # refused up front, naming the option and the reason
        with pytest.raises(SystemExit, match=f"--link-gbit: {reason}"):
            plan_from_args(args)
        return
    plan = plan_from_args(args)
    cmd = run_command(plan, "dedup", 0)
    assert cmd[:3] == ["unshare", "--net", "--"]
    assert cmd[cmd.index("--gbit") + 1] == "1.0"
    behind_link = cmd[cmd.index("--", 3) + 1:]  # what runs inside the shaped namespace
    assert behind_link[1:4] == ["-m", "dlrmtrain", "train"]
    assert plan.system("dedup") == "cpu2_gloo_link-1gbit_codec-dedup"
    unshaped = plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "o2")]))
    assert run_command(unshaped, "none", 0)[0] != "unshare"
    with pytest.raises(SystemExit, match="--link-gbit: link rate must be > 0"):
        plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "o3"),
                                   "--link-gbit", "0"]))



def test_a_delay_without_a_rate_is_refused_before_any_launch(tmp_path):
    from dlrmtrain.mlperf_runner import parse_args, plan_from_args

    config = tmp_path / "tiny.yaml"
    dump_config(tiny_config(str(tmp_path / "unused"), *MLPERF_SHAPE, *RUN), config)
    with pytest.raises(SystemExit, match="--link-latency-ms needs --link-gbit"):
        plan_from_args(parse_args(["--config", str(config), "--out", str(tmp_path / "out"),
                                   "--link-latency-ms", "5"]))
    assert not (tmp_path / "out").exists()

def test_dlrmv4_derived_rules_take_their_numbers_from_the_config():
    mini = Path(__file__).parents[2] / "configs" / "mini_dlrmv4.yaml"
    grid = ["mlperf.eval_every_data_pct=0.25", "mlperf.skip_eval_epoch_pct=0.25"]
    cfg = load_config(mini, grid)
    synthetic = cfg.data.yambda.synthetic
    train = expected_train_samples(cfg)
    assert train == synthetic.num_users * synthetic.anchors_per_user  # what the loader trains on
    assert expected_eval_samples(cfg) == synthetic.num_users * synthetic.eval_anchors_per_user
    scale = dlrmv4_scale(cfg, train)
    assert (scale.train_samples, scale.max_sequence_length, scale.warmup_steps) == (
        train, cfg.model.hstu.max_seq_len, cfg.optim.warmup_steps)
    assert scale.reference_lr == pytest.approx(cfg.optim.lr * 8192 / cfg.run.global_batch_size)
    assert (scale.eval_every_data_pct, scale.skip_eval_epoch_pct) == (0.25, 0.25)
    # The rules' own first eval (45.8 M samples at batch 256) is beyond a small run: refused.
    with pytest.raises(SystemExit, match="mlperf.skip_eval_epoch_pct"):
        dlrmv4_scale(load_config(mini, ["mlperf.skip_eval_epoch_pct=null"]), train)
    with pytest.raises(SystemExit, match="--train-samples"):
        expected_train_samples(load_config(mini, ["data.source=yambda"]))
