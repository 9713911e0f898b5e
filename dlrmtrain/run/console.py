"""What a person reads on the console: a few lines at start and end.

The full sharding plan goes to plan.txt and the per-table comm figures to
comm_stats.json; the console gets their summaries (one line per sharding type,
rank or codec, the totals, the largest tables). A column a codec did not measure
shows `—`, never a number that looks measured.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional


def print_once(message: str, by_rank: int = 0) -> None:
    """`message` on stderr, printed by one rank of the job (`by_rank`): what every rank
    would say alike is said once."""
    if os.environ.get("RANK", "0") == str(by_rank):
        print(message, file=sys.stderr, flush=True)


def human_bytes(n: float) -> str:
    """`n` bytes as a person reads them: 512 B, 1.5 KB, 124.0 MB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


NOT_MEASURED = "—"


def _measures_distinct(codec: str) -> bool:
    """Whether `codec` counts distinct bags (only the codecs that read the ids do;
    for the others the comm stats record every bag as distinct)."""
    from dlrmtrain.comm.registry import get_codec

    try:
        return bool(get_codec(codec).needs_ids)
    except Exception:  # noqa: BLE001 - a name the registry no longer knows: say nothing
        return False


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def comm_summary(stats: dict[str, Any], full_path: Optional[str] = None, top: int = 3) -> str:
    """`collect_comm_stats` output in a few lines: one per codec, the total, the
    tables that move the most bytes, and the time the codec took."""
    if not stats["tables"]:
        return "comm: no codec dists (codec none everywhere: TorchRec's stock all-to-all)"
    steps = max(stats["steps"], 1)
    tables: dict[str, dict] = stats["tables"]
    lines = [f"comm: embedding all-to-all over {stats['steps']} forward passes "
             f"({stats['scope']}; MiB per pass)", *_codec_rows(tables, steps), _total_line(stats, steps)]
    if stats.get("ids_sent_per_step") is not None:
        lines.append(f"  per pass: ids sent {stats['ids_sent_per_step']:,.0f}, rows looked up "
                     f"{stats['rows_looked_up_per_step']:,.0f}, rows sent {stats['rows_sent_per_step']:,.0f} "
                     "(whole rows: a column-wise table once)")
    largest = sorted(tables.items(), key=lambda kv: -kv[1]["payload_fwd_recv_bytes"])[:top]
    lines.append("  most bytes: " + ", ".join(
        f"{name} {_mib(t['payload_fwd_recv_bytes'] / steps)}" for name, t in largest))
    lines.append(_time_line(stats))
    lines += _when_present(stats)
    if full_path:
        lines.append(f"  per table: {full_path}")
    return "\n".join(lines)


def _codec_rows(tables: dict[str, dict], steps: int) -> list[str]:
    """The header and one row per codec: tables, distinct fraction, MiB received, none's, ratio."""
    lines = [f"  {'codec':<12} {'tables':>6} {'distinct':>8} {'fwd recv':>9} {'none':>9} "
             f"{'ratio':>6} {'ids sent':>9}"]
    by_codec: dict[str, list[dict]] = {}
    for row in tables.values():
        by_codec.setdefault(row["codec"], []).append(row)
    for codec, rows in sorted(by_codec.items()):
        bags = sum(r["bags"] for r in rows)
        distinct = (f"{sum(r['unique_bags'] for r in rows) / bags:.3f}"
                    if bags and _measures_distinct(codec) else NOT_MEASURED)
        recv = sum(r["payload_fwd_recv_bytes"] for r in rows)
        stock = sum(r["uncompressed_fwd_recv_bytes"] for r in rows)
        ratio = f"{stock / recv:.2f}x" if recv and stock else NOT_MEASURED  # stock 0: not counted
        ids = sum(r["id_sent_bytes"] for r in rows)
        lines.append(f"  {codec:<12} {len(rows):>6} {distinct:>8} {_mib(recv / steps):>9} "
                     f"{_mib(stock / steps):>9} {ratio:>6} {_mib(ids / steps):>9}")
    return lines


def _total_line(stats: dict[str, Any], steps: int) -> str:
    tot = stats["total"]
    payload = tot["payload_fwd_recv_bytes"] + tot["payload_bwd_recv_bytes"]
    stock = 2 * tot["uncompressed_fwd_recv_bytes"]
    ids = tot["id_recv_bytes"]
    with_ids = (f", {(stock + ids) / (payload + ids):.2f}x with the id all-to-all" if ids
                else " (id all-to-all not counted)")
    return (f"  total: {_mib(tot['payload_fwd_recv_bytes'] / steps)} MiB fwd recv per pass; "
            + (f"payload ratio to none (fwd+bwd) {stock / payload:.2f}x{with_ids}"
               if payload and stock else "payload 0 bytes" if not payload
               else "no full-batch figure to compare with (dedup at the source: see a none run)"))


def _time_line(stats: dict[str, Any]) -> str:
    syncs = ("" if stats.get("host_syncs_per_step") is None else
             f"; host syncs on the critical path {stats['host_syncs_per_step']:.2f}/step (plans made "
             f"ahead at the pipeline's input stage: {stats['planned_ahead_steps']} of {stats['steps']} passes)")
    return (f"  codec {stats['codec_seconds_per_step'] * 1e3:.2f} ms/step, transfer "
            f"{stats['transfer_seconds_per_step'] * 1e3:.2f} ms/step{syncs}; extra host syncs "
            f"{stats['extra_syncs']}")


def _when_present(stats: dict[str, Any]) -> list[str]:
    """The lines only some runs have: auto's decisions, two levels, row-wise fallbacks, LOSSY."""
    lines = []
    decisions = stats.get("auto_decisions", [])
    if decisions:
        lines.append(f"  auto: {decisions[0]}" + (f" (+{len(decisions) - 1} more decisions)"
                                                   if len(decisions) > 1 else ""))
    if stats.get("messages_per_step"):
        lines.append(f"  hierarchy {'/'.join(stats['hierarchy'])}: {stats['messages_per_step']:.1f} "
                     f"messages/step ({stats['inter_node_messages_per_step']:.1f} between nodes); "
                     f"MiB/step between nodes {_mib(stats['inter_node_bytes_per_step'])}, inside "
                     f"{_mib(stats['intra_node_bytes_per_step'])}, node id exchange "
                     f"{_mib(stats['id_exchange_bytes_per_step'])}")
    if stats.get("hop_ms_per_step"):
        lines.append("  two-level ms/step per hop: " + ", ".join(
            f"{hop} {ms:.1f}" for hop, ms in stats["hop_ms_per_step"].items()))
    if stats.get("fallback_steps"):
        lines.append(f"  row-wise: {stats['fallback_steps']} steps had multi-id bags and used "
                     f"TorchRec's reduce-scatter (codec none)")
    if stats.get("lossy_codecs"):
        lines.append(f"  LOSSY codecs {', '.join(stats['lossy_codecs'])}: embeddings and "
                     f"gradients rounded on the wire; training differs from codec none")
    return lines


def plan_summary(title: str, lines: list[str], full_path: Optional[str] = None) -> str:
    """The compact plan (distributed.planner.summarize_plan) under a title line."""
    head = title + (f" (full plan: {full_path})" if full_path else "")
    return "\n".join([head, *lines])


def codec_label(codec: str, table_codecs: dict[str, str]) -> str:
    """The run's codec and its per-table overrides, e.g. `dedup (t_cat_3: none)`."""
    overrides = ", ".join(f"{t}: {c}" for t, c in sorted(table_codecs.items()))
    return codec + (f" ({overrides})" if overrides else "")
