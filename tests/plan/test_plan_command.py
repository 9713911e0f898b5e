"""`dlrmtrain plan` (issue 42, item 3): the plan TorchRec's planner makes for a cluster that
need not exist, each GPU's memory by part, a verdict, and what would fit; no rank started,
the model on the meta device. Its remedies are checked by taking them: planned again with
what it recommends, the config fits."""

from __future__ import annotations

import re

import pytest

from dlrmtrain.cli import main
from dlrmtrain.features import TABLE_NAMES
from tests.config.test_workloads import PACKAGE

CONFIGS = PACKAGE.parent / "configs"
RANK_LINE = re.compile(r"^  (\d+) +([\d,.]+) +([\d,.]+) +([\d,.]+) +([\d,.]+) +([\d,.]+) +([\d,.]+)  (.*)$")


def plan(capsys, config: str, gpus: int, gb: float, *overrides: str) -> tuple[int, str]:
    code = main(["plan", "--config", str(CONFIGS / config), "--gpus", str(gpus),
                 "--gpu-memory-gb", str(gb), *overrides])
    return code, capsys.readouterr().out


def ranks(out: str) -> dict[int, list[float]]:
    """rank → [tables, optimizer, dense, activations, total, host] from the memory table."""
    return {int(m[1]): [float(m[i].replace(",", "")) for i in range(2, 8)]
            for m in map(RANK_LINE.match, out.splitlines()) if m}


def test_mini_dlrmv4_fits_two_1gb_gpus_each_holding_half_of_every_table(capsys):
    code, out = plan(capsys, "mini_dlrmv4.yaml", 2, 1)
    assert code == 0 and out.splitlines()[-1] == "verdict: fits"
    assert "on 2 × 1.0 GB GPUs" in out and "local batch 64 (run.global_batch_size 128), fp32" in out
    table_lines = [line for line in out.splitlines() if re.match(r"^  \w+ +[\d,]+ rows ", line)]
    assert len(table_lines) == 11 and all(re.search(r"row_wise +fused +ranks 0-1$", line) for line in table_lines)
    per_rank = ranks(out)
    total_rows = 12_000 + 500 + 3_000 + 8_192 + 7 * 20_000  # the synthetic catalog and the crosses
    assert sorted(per_rank) == [0, 1]
    for tables, optimizer, dense, activations, total, host in per_rank.values():
        assert tables == pytest.approx(total_rows * 32 * 4 / 2 / 2**20, abs=0.05)  # MB: half of each table
        assert optimizer == pytest.approx(total_rows * 4 / 2 / 2**20, abs=0.05)  # RowWiseAdagrad: a fp32 per row
        assert host == 0 and total == pytest.approx(tables + optimizer + dense + activations, abs=0.15)


PADDED = "model.hstu.attention=padded"
"""The [B, H, N, N] attention (`auto` plans the triton one for GPUs): the heaviest, refused by name."""


def test_mini_dlrmv4_on_four_small_gpus_does_not_fit_and_each_remedy_does(capsys):
    code, out = plan(capsys, "mini_dlrmv4.yaml", 4, 0.03, PADDED)
    assert code == 1
    verdict = next(line for line in out.splitlines() if line.startswith("verdict:"))
    assert re.match(r"^verdict: does not fit: the rest of each STU layer needs [\d.]+ MB per rank at local batch "
                    r"32 × 64 rows, 3 STU layers, fp32, attention padded .*, but cuda memory has 30\.7 MB "
                    r"available per rank \([\d.]+ MB too much\): use a smaller run\.global_batch_size$", verdict)
    gpus = int(re.search(r"more GPUs: (\d+) × 30\.7 MB at run\.global_batch_size 128", out)[1])
    batch = re.search(r"a smaller local batch: (\d+) per GPU \(run\.global_batch_size=(\d+)\)", out)
    assert gpus > 4 and 0 < int(batch[1]) < 32 and int(batch[2]) == 4 * int(batch[1])
    assert plan(capsys, "mini_dlrmv4.yaml", gpus, 0.03, PADDED)[0] == 0
    assert plan(capsys, "mini_dlrmv4.yaml", 4, 0.03, PADDED, f"run.global_batch_size={batch[2]}")[0] == 0
    assert plan(capsys, "mini_dlrmv4.yaml", 4, 0.03, PADDED, f"run.global_batch_size={4 * int(batch[1]) + 4}")[0] == 1


def test_table_wise_tables_land_on_one_gpu_each_and_add_up(capsys):
    code, out = plan(capsys, "quickstart.yaml", 2, 1)
    assert code == 0
    per_rank = ranks(out)
    sizes = [40000, 2000, 60000, 30000, 300, 20, 12000, 600, 4, 20000, 8000, 50000, 6000, 30, 10000,
             40000, 10, 4000, 2000, 6, 45000, 14, 16, 18000, 100, 14000]  # configs/quickstart.yaml
    assert sum(r[0] for r in per_rank.values()) == pytest.approx(sum(sizes) * 16 * 4 / 2**20, abs=0.1)
    assert all(r[1] == r[0] for r in per_rank.values())  # Adagrad: a state as large as the weights
    placed = re.findall(r"^  (t_cat_\d+) +[\d,]+ rows  table_wise +fused +rank (\d)$", out, re.M)
    assert sorted(t for t, _ in placed) == sorted(TABLE_NAMES)
    for rank, (tables, *_rest) in per_rank.items():
        on_rank = sum(sizes[TABLE_NAMES.index(t)] for t, r in placed if int(r) == rank)
        assert tables == pytest.approx(on_rank * 16 * 4 / 2**20, abs=0.05)


def test_the_full_dlrmv4_config_on_eight_80gb_gpus_names_the_attention_and_what_would_fit(capsys):
    code, out = plan(capsys, "mlperf_dlrmv4.yaml", 8, 80, PADDED)
    assert code == 1
    assert re.search(r"^verdict: does not fit: the attention \(padded\) needs [\d,.]+ GB per rank at local batch "
                     r"1,024 × 4,096 rows", out, re.M)
    assert all(r[0] == pytest.approx(69.9, abs=0.1) for r in ranks(out).values())  # ~293 M rows × 512 fp32 / 8
    assert re.search(r"^  as configured:\n    more GPUs: \d+ × 80\.0 GB.*\n    a smaller local batch: \d+ "
                     r"per GPU.*\n    fused_uvm_caching for .*\n  with model\.hstu\.attention=triton:\n"
                     r"    more GPUs:", out, re.M)


@pytest.mark.parametrize("args, message", [
    (["--gpus", "3", "--gpu-memory-gb", "80"], r"run\.global_batch_size: 8192 does not divide by 3 GPUs"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "--gpus-per-node", "3"], r"--gpus-per-node: 3 does not divide"),
    (["--gpus", "8", "--gpu-memory-gb", "80", "sharding.uvm_caching.load_factor=2"],
     r"sharding\.uvm_caching\.load_factor: must be in \(0, 1\]"),
])
def test_a_bad_option_or_key_is_one_line_and_exit_2(capsys, args, message):
    assert main(["plan", "--config", str(CONFIGS / "mlperf_dlrmv4.yaml"), *args]) == 2
    err = capsys.readouterr().err
    assert re.match(rf"^config error: {message}", err) and err.count("\n") == 1


def test_tables_no_gpu_can_hold_get_no_plan_and_the_memory_checks_verdict(capsys):
    """Half of mini_dlrmv4's 21 MB of tables on each of two 5 MB GPUs (one sample each): TorchRec's
    planner finds no plan; the verdict is the run's own check (the tables spread evenly), naming
    the tables; caching them in host memory fits."""
    code, out = plan(capsys, "mini_dlrmv4.yaml", 2, 0.005, "run.global_batch_size=2")
    assert code == 1 and not ranks(out)
    assert "  TorchRec's planner found no plan: Unable to find a plan for this model" in out
    assert re.search(r"^verdict: does not fit: the embedding tables need at least 10\.0 MB per rank for their "
                     r"fp32 weights .*: shrink the data's tables", out, re.M)
    assert re.search(r"^    fused_uvm_caching for .*: [\d.]+ MB per GPU at local batch \d+", out, re.M)


def test_uvm_cached_tables_take_their_cache_on_the_gpu_and_their_rows_in_host_memory(capsys):
    code, out = plan(capsys, "mini_dlrmv4.yaml", 2, 1, "sharding.uvm_caching.min_rows=20000",
                     "sharding.uvm_caching.load_factor=0.25")
    assert code == 0
    cached = re.findall(r"^  (\w+) +20,000 rows  row_wise +fused_uvm_caching \(cache 0\.25\) ranks 0-1$", out, re.M)
    assert len(cached) == 7  # the crosses; the other four tables keep the plain fused kernel
    crosses, others = 7 * 20_000 * 32 * 4, (12_000 + 500 + 3_000 + 8_192) * 32 * 4
    for tables, optimizer, _dense, _activations, _total, host in ranks(out).values():
        assert tables == pytest.approx((others + 0.25 * crosses) / 2 / 2**20, abs=0.05)
        assert host == pytest.approx(crosses / 2 / 2**20, abs=0.05)
