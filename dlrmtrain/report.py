"""Pictures and a short markdown summary of finished runs.

    dlrmtrain report RUN_DIR [RUN_DIR ...] [--out DIR] [--mixed]

Reads what a run directory holds (config.yaml, metrics.jsonl, summary.json,
and comm_stats.json / step_breakdown.json where present) and writes to --out
(default: ./report):

    auc.png         eval AUC against time since run start and against steps, target line
    loss.png        train loss against steps
    throughput.png  training samples/s against steps
    comm_bytes.png  embedding all-to-all MiB per forward pass per table (runs with comm_stats.json)
    step_time.png   step-time breakdown per run (runs with step_breakdown.json)
    report.md       one table row per run, a line per `auto` run (what it chose and when), the images

Runs are coloured by codec, so codec on and off read side by side; with many
runs (e.g. MLPerf's seeded repeats) each codec's runs share its colour.

Runs of different model families (DLRM and DLRMv4: other tables, data and wire) are
refused on one chart unless `--mixed` is given; then each family gets its own
all-to-all chart (comm_bytes_<family>.png). A torn last line of metrics.jsonl (a
run killed mid-write) is skipped, and so is the torn start an older resume glued
onto the next record; the report says what it skipped, on the console and in
report.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from dlrmtrain.comm.auto.timeline import run_line
from dlrmtrain.comm.labels import contender_label
from dlrmtrain.mlperf.benchmarks import display_label
from dlrmtrain.mlperf.contenders import split_precision, with_precision
from dlrmtrain.workloads import workload_named, workload_of_saved

CODEC_COLOURS = {"none": "#4c72b0", "dedup": "#dd8452", "fp16": "#55a868", "bf16": "#c44e52",
                 "int8": "#8172b3", "fp8": "#937860", "dedup+fp16": "#da8bc3",
                 "dedup+bf16": "#8c8c8c", "dedup/node": "#64b5cd", "auto/node": "#ccb974"}
OTHER_COLOUR = "#333333"


class ReportError(ValueError):
    """A run directory that cannot be reported on, with the file named."""


class MixedFamilies(ReportError):
    """Runs of different model families given without --mixed."""


def model_family(arch: str) -> str:
    """The model family of a `model.arch`, its Workload's (`Workload.family`): runs of one
    family share data, tables and the shapes on the wire, so one chart compares them. An
    unknown arch is its own."""
    try:
        return workload_named(arch).family
    except ValueError:
        return arch


@dataclass
class RunData:
    """What the report needs from one run directory."""

    path: Path
    name: str
    codec: str
    global_batch_size: int
    target_auc: float | None
    summary: dict[str, Any]
    train: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    comm: dict[str, Any] | None = None
    breakdown: dict[str, Any] | None = None

    benchmark: str = ""
    """The MLPerf benchmark of its family (names the reference's own wire)."""
    arch: str = ""
    """Its model.arch (as its family's Workload names it)."""
    family: str = ""
    """Its model family (`model_family`)."""
    skipped: list[str] = field(default_factory=list)
    """What of its records was not read, and why (torn lines)."""

    @property
    def label(self) -> str:
        return f"{self.name} ({display_label(self.benchmark, self.codec)})"

    @property
    def start_time(self) -> float:
        """Wall clock of the run start: the first logged window began then, and
        its samples/s says how long it lasted."""
        first = self.train[0]
        return first["time"] - first["step"] * self.global_batch_size / first["samples_per_s"]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not valid JSON ({e})") from None


def load_run(path: str | Path) -> RunData:
    path = Path(path)
    for need in ("config.yaml", "metrics.jsonl", "summary.json"):
        if not (path / need).is_file():
            raise ReportError(f"{path}: no {need} (not a finished dlrmtrain run directory)")
    cfg = yaml.safe_load((path / "config.yaml").read_text())
    workload = workload_of_saved(cfg)
    run = RunData(path=path, name=cfg["run"]["name"],
                  codec=_contender(cfg["comm"], cfg.get("precision", {})),
                  global_batch_size=cfg["run"]["global_batch_size"],
                  target_auc=cfg["eval"]["target_auc"], summary=_read_json(path / "summary.json"),
                  benchmark=workload.benchmark, arch=workload.arch, family=workload.family)
    for record in _read_records(path / "metrics.jsonl", run.skipped):
        {"train": run.train, "eval": run.evals}.get(record.get("kind"), []).append(record)
    for aside in sorted(path.glob("metrics.jsonl.torn-*")):
        run.skipped.append(f"{aside}: {aside.stat().st_size} bytes of a torn line, set aside "
                           f"when the run resumed (not read)")
    if not run.train:
        raise ReportError(f"{path / 'metrics.jsonl'}: no training steps logged")
    if (path / "comm_stats.json").is_file():
        run.comm = _read_json(path / "comm_stats.json")
    if (path / "step_breakdown.json").is_file():
        run.breakdown = _read_json(path / "step_breakdown.json")
    return run


_RECORD_START = '{"kind": '
"""How every record of metrics.jsonl begins (records.RunRecords.log)."""


def _read_records(metrics: Path, skipped: list[str]) -> list[dict[str, Any]]:
    """Every record of `metrics`, less a torn last line (one without its newline: the
    run stopped mid-write) and the torn start of a line an older resume glued its first
    record onto; each skip is said in `skipped`. Any other bad line is a ReportError."""
    data = metrics.read_bytes()
    torn_bytes = len(data) - (data.rfind(b"\n") + 1)  # 0 when the file ends with its newline
    lines = data.decode("utf-8", errors="replace").split("\n")[:-1]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
            continue
        except json.JSONDecodeError as e:
            error = e
        glued = _glued_record(line)
        if glued is None:
            raise ReportError(f"{metrics}:{number}: not valid JSON ({error})") from None
        start, record = glued
        skipped.append(f"{metrics}:{number}: skipped its first {start} bytes, a torn line "
                       f"an older resume appended its record to")
        records.append(record)
    if torn_bytes:
        skipped.append(f"{metrics}:{len(lines) + 1}: skipped a torn last line ({torn_bytes} "
                       f"bytes; the run stopped while writing it)")
    return records


def _glued_record(line: str) -> tuple[int, dict[str, Any]] | None:
    """(where it starts, the record) of a whole record that ends `line` after a torn one."""
    start = line.find(_RECORD_START, 1)
    while start > 0:
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            start = line.find(_RECORD_START, start + 1)
            continue
        return (start, record) if isinstance(record, dict) else None
    return None


def _contender(comm: dict[str, Any], precision: dict[str, Any]) -> str:
    """The run's codec as the MLPerf runner names its contenders: `<codec>/node` over two levels,
    `@bf16` under mixed precision, so that the runs of a codec are told apart."""
    label = contender_label(comm["codec"], comm.get("hierarchy", "flat"))
    return with_precision(label, "bf16" if precision.get("mode") == "bf16" else None)


def _colour(codec: str) -> str:
    return CODEC_COLOURS.get(split_precision(codec)[0], OTHER_COLOUR)


def _legend(ax, runs: list[RunData]) -> None:
    """One entry per run when few, else one per codec (runs of a codec share its colour)."""
    from matplotlib.lines import Line2D

    if len(runs) <= 6:
        ax.legend(fontsize=8)
        return
    codecs = sorted({r.codec for r in runs})
    ax.legend([Line2D([], [], color=_colour(c)) for c in codecs],
              [f"codec {c} ({sum(r.codec == c for r in runs)} runs)" for c in codecs], fontsize=8)


def _line_alpha(runs: list[RunData]) -> float:
    return 0.9 if len(runs) <= 6 else 0.5


def _line_style(runs: list[RunData], index: int) -> str:
    """Few runs: solid, dashed, dotted... so identical curves (lossless codecs) stay visible."""
    return ("-", "--", ":", "-.")[index % 4] if len(runs) <= 6 else "-"


def _thousands(ax) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def plot_auc(runs: list[RunData], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    runs = [r for r in runs if r.evals]
    if not runs:
        return None
    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, r in enumerate(runs):
        t0 = r.start_time
        style = dict(color=_colour(r.codec), marker="o", markersize=3, label=r.label,
                     alpha=_line_alpha(runs), linestyle=_line_style(runs, i))
        by_time.plot([e["time"] - t0 for e in r.evals], [e["auc"] for e in r.evals], **style)
        by_step.plot([e["step"] for e in r.evals], [e["auc"] for e in r.evals], **style)
    targets = {r.target_auc for r in runs if r.target_auc is not None}
    for ax in (by_time, by_step):
        for t in targets:
            ax.axhline(t, color="black", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    if targets:
        by_time.annotate(f"target AUC {max(targets)}", xy=(0, max(targets)),
                         xycoords=("axes fraction", "data"), xytext=(4, 3),
                         textcoords="offset points", ha="left", fontsize=8)
    by_time.set(xlabel="time since run start (s, evaluations included)", ylabel="eval AUC",
                title="eval AUC against time")
    by_step.set(xlabel="training step", title="eval AUC against steps")
    _legend(by_step, runs)
    return _save(fig, out / "auc.png")


def plot_loss(runs: list[RunData], out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, r in enumerate(runs):
        ax.plot([x["step"] for x in r.train], [x["loss"] for x in r.train], color=_colour(r.codec),
                label=r.label, alpha=_line_alpha(runs), linewidth=1.2,
                linestyle=_line_style(runs, i))
    ax.set(xlabel="training step", ylabel="train loss (mean over the logging window)",
           title="training loss")
    ax.grid(alpha=0.3)
    _legend(ax, runs)
    return _save(fig, out / "loss.png")


def plot_throughput(runs: list[RunData], out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, r in enumerate(runs):
        ax.plot([x["step"] for x in r.train], [x["samples_per_s"] for x in r.train],
                color=_colour(r.codec), label=r.label, alpha=_line_alpha(runs), linewidth=1.2,
                linestyle=_line_style(runs, i))
    ax.set(xlabel="training step", ylabel="samples/s (over the logging window)",
           title="training throughput", ylim=(0, None))
    _thousands(ax)
    ax.grid(alpha=0.3)
    _legend(ax, runs)
    return _save(fig, out / "throughput.png")


def plot_comm_bytes(runs: list[RunData], out: Path, filename: str = "comm_bytes.png") -> Path | None:
    """Forward all-to-all MiB per pass per table: each run's codec, and the stock
    all-to-all (what codec `none` sends, counted by the codec dists themselves)."""
    import matplotlib.pyplot as plt
    import numpy as np

    runs = [r for r in runs if r.comm and r.comm.get("tables")]
    if not runs:
        return None
    tables = list(runs[0].comm["tables"])
    mib = 2.0 ** 20

    def per_pass(r: RunData, key: str) -> list[float]:
        steps = max(r.comm["steps"], 1)
        return [r.comm["tables"].get(t, {}).get(key, 0) / steps / mib for t in tables]

    def totals(r: RunData, stock: bool) -> list[float]:
        """MiB per pass: forward payload, backward payload, ids (the ids cross under every codec)."""
        t, steps = r.comm["total"], max(r.comm["steps"], 1) * mib
        fwd = t["uncompressed_fwd_recv_bytes"] if stock else t["payload_fwd_recv_bytes"]
        bwd = t["uncompressed_fwd_recv_bytes"] if stock else t["payload_bwd_recv_bytes"]
        return [fwd / steps, bwd / steps, t["id_recv_bytes"] / steps]

    # (label, colour, MiB per table, [fwd, bwd, ids] per pass)
    series = [("stock all-to-all (codec none)", _colour("none"),
               per_pass(runs[0], "uncompressed_fwd_recv_bytes"), totals(runs[0], stock=True))]
    shown = runs if len(runs) <= 4 else list({r.codec: r for r in runs}.values())
    for r in shown:
        series.append((r.label if len(runs) <= 4 else f"codec {r.codec}", _colour(r.codec),
                       per_pass(r, "payload_fwd_recv_bytes"), totals(r, stock=False)))
    y = np.arange(len(tables))
    height = 0.8 / len(series)
    fig, (ax, tot) = plt.subplots(1, 2, figsize=(11, max(4.0, 0.28 * len(tables) + 1.5)),
                                  gridspec_kw=dict(width_ratios=[3, 1.4]))
    for i, (label, colour, values, _) in enumerate(series):
        ax.barh(y + (i - (len(series) - 1) / 2) * height, values, height, label=label, color=colour)
    ax.set_yticks(y, tables, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="MiB received per forward pass, forward payload (all ranks)",
           title="embedding all-to-all bytes per table")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    # Totals per pass, stacked: forward payload, backward payload, ids.
    x = np.arange(len(series))
    bottom = np.zeros(len(series))
    for part, (name, alpha) in enumerate((("forward", 1.0), ("backward", 0.55), ("ids", 0.25))):
        values = np.array([s[3][part] for s in series])
        tot.bar(x, values, 0.6, bottom=bottom, color=[s[1] for s in series], alpha=alpha,
                edgecolor="black", linewidth=0.4, label=name)
        bottom += values
    stock_total = bottom[0]
    for i, total in enumerate(bottom):
        tot.annotate(f"{total:.2f}" + ("" if i == 0 else f"\n{stock_total / total:.2f}x less"),
                     (i, total), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    tot.set_xticks(x, ["none" if i == 0 else s[0].split("(")[-1].rstrip(")") if len(runs) <= 4
                       else s[0].replace("codec ", "") for i, s in enumerate(series)], fontsize=8)
    tot.set(ylabel="MiB per forward pass", title="all tables, per pass", ylim=(0, stock_total * 1.25))
    tot.legend(fontsize=7, loc="upper right")
    tot.grid(axis="y", alpha=0.3)
    return _save(fig, out / filename)


def plot_step_time(runs: list[RunData], out: Path) -> Path | None:
    import matplotlib.pyplot as plt

    runs = [r for r in runs if r.breakdown]
    if not runs:
        return None
    phases = list(dict.fromkeys(p for r in runs for p in r.breakdown["phase_ms_per_step"]))
    fig, ax = plt.subplots(figsize=(9, 1.4 + 1.0 * len(runs)))
    left = [0.0] * len(runs)
    colours = plt.get_cmap("tab10")
    for i, phase in enumerate(phases):
        widths = [r.breakdown["phase_ms_per_step"].get(phase, 0.0) for r in runs]
        ax.barh(range(len(runs)), widths, left=left, label=phase, color=colours(i))
        left = [a + b for a, b in zip(left, widths)]
    for i, r in enumerate(runs):  # the collectives inside forward/backward, as measured
        inside = "".join(f"\n  {k}: {ms:.1f} ms"
                         for k, ms in r.breakdown["collective_ms_per_step"].items())
        ax.annotate(f"{left[i]:.1f} ms per step" + (f", of which{inside}" if inside else ""),
                    (left[i], i), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(range(len(runs)), [r.label for r in runs], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="ms per step (rank 0)", title="step-time breakdown", xlim=(0, max(left) * 1.9))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, out / "step_time.png")


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def _fmt(value: float | None, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


def render_markdown(runs: list[RunData], images: list[Path]) -> str:
    lines = ["# dlrmtrain report", "",
             "| run | codec | ranks | steps | samples/s | final AUC | time to target (s) "
             "| all-to-all fwd ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        s = r.summary
        ratio = None
        if r.comm and r.comm.get("tables"):
            total = r.comm["total"]
            if total["payload_fwd_recv_bytes"]:
                ratio = total["uncompressed_fwd_recv_bytes"] / total["payload_fwd_recv_bytes"]
        target = _fmt(s.get("time_to_target_s"), ".1f",
                      "not reached" if s.get("target_auc") is not None else "no target")
        lines.append(f"| {r.name} | {r.codec} | {s['world_size']} | {s['steps']} "
                     f"| {s['samples_per_second']:,.0f} | {_fmt(s.get('final_auc'), '.4f')} "
                     f"| {target} | {_fmt(ratio, '.2f')}{'x' if ratio else ''} |")
    lines += ["", "Run directories: " + ", ".join(f"`{r.path}`" for r in runs), ""]
    families = _by_family(runs)
    if len(families) > 1:
        lines += ["Model families drawn together (--mixed): " + "; ".join(
            f"{f}: {', '.join(r.name for r in members)}" for f, members in families.items()), ""]
    chose = [f"- {r.name} ({r.codec}): {auto_line(r.comm, r.summary)}" for r in runs
             if r.comm and r.comm.get("auto_decisions")]
    if chose:
        lines += ["What auto chose and when (steps on dedup counted from its first decision):", "", *chose, ""]
    skipped = [note for r in runs for note in r.skipped]
    if skipped:
        lines += ["Not read:", "", *[f"- {note}" for note in skipped], ""]
    lines += [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(lines) + "\n"


def auto_line(comm: dict[str, Any], summary: dict[str, Any]) -> str:
    """What auto chose and when in one line, from a run's comm_stats.json and summary.json."""
    return run_line(comm.get("auto_decisions", []), summary.get("steps", 0), comm.get("auto_steps_after_probe"))


def auto_line_of(run_dir: Path) -> str:
    """`auto_line` of a run directory; what is missing said instead."""
    comm, summary = run_dir / "comm_stats.json", run_dir / "summary.json"
    for need in (comm, summary):
        if not need.is_file():
            return f"no {need.name} in {run_dir}"
    try:
        return auto_line(_read_json(comm), _read_json(summary))
    except ReportError as e:
        return str(e)


def _by_family(runs: list[RunData]) -> dict[str, list[RunData]]:
    families: dict[str, list[RunData]] = {}
    for r in runs:
        families.setdefault(r.family, []).append(r)
    return families


def check_one_family(runs: list[RunData]) -> None:
    """MixedFamilies, naming which runs are which family, when they are not all one."""
    families = _by_family(runs)
    if len(families) < 2:
        return
    which = "; ".join(f"{f}: " + ", ".join(f"{r.path} ({r.arch})" for r in members)
                      for f, members in families.items())
    raise MixedFamilies(
        f"runs of different model families ({which}): they train other tables on other data, "
        f"so one chart would compare what is not comparable (the all-to-all chart's \"x less\" "
        f"against another family's baseline); report each family on its own, or pass "
        f"--mixed to draw them together")


def write_report(run_dirs: list[str | Path], out: str | Path, mixed: bool = False,
                 log: Callable[[str], None] = print) -> list[Path]:
    """Read the runs, write the images and report.md into `out`; return what was written.
    Runs of different model families are refused (MixedFamilies) unless `mixed`; what of
    a run's records was skipped is said through `log`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    runs = [load_run(p) for p in run_dirs]
    if not runs:
        raise ReportError("no run directories given")
    if not mixed:
        check_one_family(runs)
    for note in (note for r in runs for note in r.skipped):
        log(f"report: {note}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    families = _by_family(runs)
    comm = ([plot_comm_bytes(runs, out)] if len(families) == 1 else
            [plot_comm_bytes(members, out, f"comm_bytes_{family}.png")
             for family, members in families.items()])
    images = [p for p in (plot_auc(runs, out), plot_loss(runs, out), plot_throughput(runs, out),
                          *comm, plot_step_time(runs, out)) if p]
    md = out / "report.md"
    md.write_text(render_markdown(runs, images))
    return [*images, md]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dlrmtrain report", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run directories (each holds metrics.jsonl, summary.json)")
    p.add_argument("--out", default="report", help="folder for the images and report.md (default: report)")
    p.add_argument("--mixed", action="store_true",
                   help="draw runs of different model families (DLRM, DLRMv4) on the same charts")
    args = p.parse_args(argv)
    try:
        written = write_report(args.runs, args.out, mixed=args.mixed)
    except ReportError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"report: wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
