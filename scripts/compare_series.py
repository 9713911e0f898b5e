"""Two `dlrmtrain mlperf` series seed by seed: whether each seed reached the target at the same
evaluation in both, and how far apart its losses and evaluation AUCs are.

    python scripts/compare_series.py OUT_A OUT_B

OUT_A and OUT_B are the runner's --out folders (one contender each, e.g. the same codec with
model.hstu.attention=padded and =blocked). A seed's run is `runs/<system>/run<i>_seed<s>/`;
its summary.json gives the evaluations and the stop, metrics.jsonl the losses rank 0 logged
(every logging.metrics_every_steps). Exits 1 when a seed stopped at different evaluations or
reached the target in one series only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def seed_runs(out: Path) -> dict[str, Path]:
    """seed label (run<i>_seed<s>) → run folder, of the series' one system."""
    runs = [p for p in sorted((out / "runs").glob("*/run*_seed*")) if p.is_dir()]
    systems = {p.parent.name for p in runs}
    if len(systems) != 1:
        raise SystemExit(f"compare_series: {out} holds {len(systems)} systems ({', '.join(sorted(systems))}); "
                         "give one series per contender")
    return {p.name: p for p in runs}


def losses(run: Path) -> dict[int, float]:
    records = (json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip())
    return {r["step"]: r["loss"] for r in records if r.get("kind") == "train"}


def compare_seed(a: Path, b: Path) -> dict:
    """One seed's stop, its evaluations' AUC gap and its losses' relative gap."""
    sa, sb = (json.loads((p / "summary.json").read_text()) for p in (a, b))
    la, lb = losses(a), losses(b)
    common = sorted(set(la) & set(lb))
    rel = [abs(la[s] - lb[s]) / abs(la[s]) for s in common if la[s]]
    aucs = {e["step"]: e["auc"] for e in sa["evals"]}
    auc_gaps = [abs(aucs[e["step"]] - e["auc"]) for e in sb["evals"] if e["step"] in aucs]
    return {"stop": (sa["steps"], sb["steps"]), "reached": (sa["reached_target"], sb["reached_target"]),
            "final_auc": (sa["final_auc"], sb["final_auc"]), "loss_steps": len(common),
            "loss_rel_max": max(rel, default=float("nan")),
            "loss_rel_first": rel[0] if rel else float("nan"),
            "auc_gap_max": max(auc_gaps, default=float("nan"))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_a", type=Path)
    p.add_argument("out_b", type=Path)
    args = p.parse_args(argv)
    runs_a, runs_b = seed_runs(args.out_a), seed_runs(args.out_b)
    seeds = sorted(set(runs_a) & set(runs_b))
    if not seeds:
        raise SystemExit(f"compare_series: no seed ran in both {args.out_a} and {args.out_b}")
    print(f"A = {args.out_a}, B = {args.out_b}")
    print("| seed | stop step A / B | target reached A / B | final AUC A / B | max eval AUC gap "
          "| losses compared | loss rel. gap at the first, at most |")
    print("|---|---|---|---|---|---|---|")
    same = True
    for seed in seeds:
        c = compare_seed(runs_a[seed], runs_b[seed])
        same &= c["stop"][0] == c["stop"][1] and c["reached"][0] == c["reached"][1]
        print(f"| {seed} | {c['stop'][0]} / {c['stop'][1]} | {c['reached'][0]} / {c['reached'][1]} | "
              f"{c['final_auc'][0]:.5f} / {c['final_auc'][1]:.5f} | {c['auc_gap_max']:.2e} | "
              f"{c['loss_steps']} | {c['loss_rel_first']:.2e}, {c['loss_rel_max']:.2e} |")
    print(f"every seed stopped at the same evaluation in both: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
