"""Step time of each codec against `none` over a real bandwidth-limited link.

For every bandwidth (unshaped, then 10, 5, 2, 1, 0.5 Gbit/s by default) and every
shape it runs scripts/bench_train.py once behind that link
(dlrmtrain.testbed.shaped_link): inside that one run the contenders (codec
`none`, each other codec, plain TorchRec) take turns in alternating blocks
(ABC, CBA, ...), so each ratio is measured side by side in one run; the median
block per contender is kept. Prints the ratios per bandwidth and saves a plot.

    python scripts/bench_link.py [--shapes mlperf quickstart] [--gbit 10 5 2 1 0.5]
        [--codecs dedup auto] [--steps 5] [--warmup-steps 8] [--rounds 3] [--out /tmp/bench_link]
        [--world-size 2] [--sim-nodes N] [--set KEY=VALUE ...]

The link is ONE loopback shared by both ranks and both directions (see
shaped_link.py): at B Gbit/s the two ranks together move B Gbit/s.
With `--sim-nodes N` the --world-size ranks run as N simulated nodes
(sim_nodes.py): only traffic between nodes crosses a link, B Gbit/s each way
per node, and the unshaped point is the same nodes with unshaped links.
A codec may carry further overrides (`--codecs dedup "dedup comm.hierarchy=node"`:
the two-level dedup); where both `dedup` and that one run, the ratio of the
two-level to the one-level dedup is printed too. `--set` overrides apply to
every contender (e.g. smaller MLPs).
Needs root, unshare and tc (and ip for nodes); without them it says so and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from plots import pyplot  # noqa: E402  (scripts/)
from dlrmtrain.testbed import shaped_link, sim_nodes  # noqa: E402
from dlrmtrain.testbed.shaped_link import LinkSpec  # noqa: E402
from dlrmtrain.mlperf.benchmarks import display_label  # noqa: E402
from dlrmtrain.workloads import workload_named  # noqa: E402

UNSHAPED = None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["mlperf", "quickstart"],
                   help="bench_train.py shapes (default: mlperf quickstart)")
    p.add_argument("--gbit", nargs="+", type=float, default=[10, 5, 2, 1, 0.5],
                   help="shaped bandwidths, Gbit/s (an unshaped run always comes first)")
    p.add_argument("--codecs", nargs="+", default=["dedup", "auto"], help="codecs compared with none")
    p.add_argument("--steps", type=int, default=5, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=3, help="timed blocks per contender")
    p.add_argument("--warmup-steps", type=int, default=8,
                   help="untimed steps per contender first (auto decides after 6 when the gap is clear)")
    p.add_argument("--no-plain", action="store_true", help="leave out plain TorchRec")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench_link"))
    p.add_argument("--timeout-min", type=float, default=30.0, help="per bench_train run")
    p.add_argument("--world-size", type=int, default=2, help="ranks in all (default: 2)")
    p.add_argument("--sim-nodes", type=int, default=None,
                   help="run the ranks as N simulated nodes; the link joins the nodes")
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides for every contender (bench_train's overrides; the base "
                        "contender is `none`, so a codec's own keys go in its contender: "
                        "--codecs \"auto comm.auto.probe_steps=2\")")
    return p.parse_args(argv)


TWO_LEVEL = "dedup comm.hierarchy=node"


def run_point(shape: str, link: LinkSpec | None, args: argparse.Namespace) -> dict:
    """One bench_train run (all contenders side by side) behind `link`."""
    tag = "unshaped" if link is None else f"{link.gbit:g}gbit"
    result = args.out / f"{shape}_{tag}.json"
    cmd = [sys.executable, str(REPO / "scripts/bench_train.py"), "--shape", shape,
           "--steps", str(args.steps), "--rounds", str(args.rounds), "--json", str(result),
           "--warmup-steps", str(args.warmup_steps), "--world-size", str(args.world_size),
           "comm.codec=none", *args.set, *(f"--vs=comm.codec={c}" for c in args.codecs)]
    if args.no_plain:
        cmd.append("--no-plain")
    if link is not None:  # bench_train puts itself behind the link
        cmd += ["--link-gbit", repr(link.gbit)]
    if args.sim_nodes:
        cmd += ["--sim-nodes", str(args.sim_nodes)]
    log = args.out / f"{shape}_{tag}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}  # this checkout's package
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                              cwd=REPO, timeout=args.timeout_min * 60)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        raise SystemExit(f"bench_train ({shape}, {tag}) exited with {done.returncode}; "
                         f"log {log}:\n{tail}")
    return json.loads(result.read_text())


def ratios(point: dict, codecs: list[str]) -> dict[str, float]:
    ms = point["ms_per_step"]
    out = {c: ms[f"dlrmtrain comm.codec={c}"] / ms["dlrmtrain"] for c in codecs}
    if "dedup" in codecs and TWO_LEVEL in codecs:  # two levels against one, same run
        out["two-level/dedup"] = out[TWO_LEVEL] / out["dedup"]
    if "plain TorchRec DMP" in ms:
        out["none/plain"] = ms["dlrmtrain"] / ms["plain TorchRec DMP"]
        for c in codecs:
            out[f"{c}/plain"] = ms[f"dlrmtrain comm.codec={c}"] / ms["plain TorchRec DMP"]
    return out


def plot(sweep: dict, codecs: list[str], path: Path, xlabel: str) -> None:
    plt = pyplot()

    outside = len(codecs) > 4  # many lines: the legend beside the plot, not over it
    fig, axes = plt.subplots(1, len(sweep), figsize=((10 if outside else 6) * len(sweep), 4.2), squeeze=False)
    for ax, (shape, points) in zip(axes[0], sweep.items()):
        labels = [p["link"] for p in points]
        xs = range(len(points))
        ax.axhline(1.0, color="grey", lw=1, ls="--", label="none (= 1)")
        for c in codecs:
            ax.plot(xs, [p["ratios"][c] for p in points], "o-",
                    label=f"{display_label(workload_named(points[0]['arch']).benchmark, c)} / none")
        if "none/plain" in points[0]["ratios"]:
            for c in codecs:
                ax.plot(xs, [p["ratios"][f"{c}/plain"] for p in points], "s:",
                        label=f"{c} / plain TorchRec")
        ax.set_xticks(list(xs), labels)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("step-time ratio (lower is faster)")
        ax.set_title(f"{shape}: {points[0]['shape_text']}", fontsize=9)
        ax.grid(alpha=0.3)
        if outside:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
        else:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sim_nodes:
        reason = sim_nodes.unavailable_reason(args.sim_nodes)
        where = (f"{args.sim_nodes} simulated nodes of {args.world_size // args.sim_nodes} "
                 "ranks; link: each node's, each way")
        if args.world_size % args.sim_nodes:
            print(f"bench_link: --world-size {args.world_size} does not split into "
                  f"--sim-nodes {args.sim_nodes} nodes", file=sys.stderr)
            return 2
    else:
        reason = shaped_link.unavailable_reason() if args.gbit else None
        where = f"link: one loopback shared by all {args.world_size} ranks, both directions"
    if reason:
        print(f"bench_link: {reason}; cannot run the shaped points", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    links = [UNSHAPED, *(LinkSpec(g) for g in args.gbit)]
    sweep: dict[str, list[dict]] = {}
    for shape in args.shapes:
        sweep[shape] = []
        for link in links:
            point = run_point(shape, link, args)
            label = "unshaped" if link is None else f"{link.gbit:g}"
            r = ratios(point, args.codecs)
            sweep[shape].append({
                "link": label, "arch": point["arch"], "ms_per_step": point["ms_per_step"], "ratios": r,
                "blocks_ms": point["blocks_ms"], "codec_ms_per_step": point.get("codec_ms_per_step"),
                "loopback_mb_per_step":  # through the link (between nodes on sim nodes)
                    point.get("loopback_mb_per_step") if link or args.sim_nodes else None,
                "shape_text": f"{point['arch']}, global batch {point['global_batch_size']}"})
            print(f"[{shape}] {label:>9}: " + "  ".join(
                f"{k} {v:.3f}" for k, v in r.items()) + "   ms/step " + "  ".join(
                f"{k}={v:.0f}" for k, v in point["ms_per_step"].items()), flush=True)
    (args.out / "sweep.json").write_text(json.dumps(sweep, indent=2) + "\n")
    png = args.out / "bench_link.png"
    plot(sweep, args.codecs, png, where)
    print("=" * 72)
    print(f"bench_link: step-time ratio to codec none (medians of {args.rounds} alternating "
          f"blocks of {args.steps} steps, each bandwidth one run); {where}")
    for shape, points in sweep.items():
        keys = list(points[0]["ratios"])
        widths = [max(14, len(k) + 2) for k in keys]
        print(f"  {shape}: {'link Gbit/s':>12}" + "".join(f"{k:>{w}}" for k, w in zip(keys, widths)))
        for p in points:
            print(f"  {'':{len(shape) + 1}} {p['link']:>12}"
                  + "".join(f"{p['ratios'][k]:{w}.3f}" for k, w in zip(keys, widths))
                  + ("   MB through the link: " + ", ".join(
                      f"{k.replace('dlrmtrain comm.codec=', '').replace('dlrmtrain', 'none')} {v:.1f}"
                      for k, v in p["loopback_mb_per_step"].items())
                     if p.get("loopback_mb_per_step") else ""))
        for c in args.codecs:
            label = display_label(workload_named(points[0]["arch"]).benchmark, c)
            if label != c:
                print(f"  {'':{len(shape) + 1}} {label}")
    print(f"  plot {png}; raw {args.out / 'sweep.json'}")
    print("=" * 72)
    return 0


if __name__ == "__main__":
    sys.exit(main())
