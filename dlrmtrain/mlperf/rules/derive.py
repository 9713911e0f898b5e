"""Derive UNOFFICIAL compliance rules for small runs from the installed official ones.

The official checker hard-codes what only a full-size run reaches: an
``eval_accuracy`` >= 0.8025 (dlrm) / >= 0.80275 (dlrm_dcnv2) / >= 0.75 (dlrmv4)
and, for dlrm_dcnv2 and dlrmv4, the eval size. dlrmv4's rules also pin numbers
of the full-size run: its train samples (which set the eval grid), sequence
length 4096, 24,000 warmup steps, a learning-rate band around 1e-6 per 8192 of
global batch, the eval spacing and the first-eval fit. A small run needs the
same rules with its own target, eval size and (dlrmv4) those numbers. This module builds them from the files the
installed ``mlperf_logging`` ships, changing nothing else:

1. Read ``training_<ruleset>/common.yaml``, ``closed_common.yaml`` and
   ``closed_<benchmark>.yaml`` — the three configs the official checker runs
   for a closed-division log of that benchmark, in that order.
2. Flatten them into one file: BEGIN codes and END checks are joined; a KEY
   that a later config redefines replaces the earlier one (the checker drops
   the earlier config's messages for such a key, so only the later one counts).
   The ``enqueue_config(...)`` calls that chained the three files are removed
   and replaced by checks that the log is ``closed`` division and of this
   benchmark — what made the official checker load those files.
3. Replace the accuracy target in ``eval_accuracy``'s ATLEAST_ONE_CHECK and,
   for dlrm_dcnv2, the number in ``eval_samples``'s CHECK. For dlrmv4 the target
   and train samples are in the BEGIN code, and `Dlrmv4Scale` replaces each of
   the numbers above where the rules state it (`_DLRMV4_NUMBERS`).

Why one flattened file: the checker resolves every config path relative to its
own package folder (``os.path.join`` keeps an absolute path as is), so a chain
of derived files would need absolute paths baked in. One file passed with an
absolute ``--config`` path needs none.

Every substitution asserts that it matched exactly once, so a changed official
file fails loudly instead of yielding rules that silently differ.

CLI (regenerates the committed files for configs/mini_mlperf.yaml):
    python -m dlrmtrain.mlperf.rules.derive
"""

from __future__ import annotations

import argparse
import hashlib
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import mlperf_logging.compliance_checker as _checker_pkg
import yaml

from dlrmtrain.mlperf.rules import (
    COMMITTED_SPECS,
    OFFICIAL_EVAL_SAMPLES,
    OFFICIAL_TARGET,
    RULES_DIR,
    RULESETS,
    DerivedRulesSpec,
    Dlrmv4Scale,
)

CHECKER_DIR = Path(_checker_pkg.__file__).parent

_ENQUEUE = re.compile(r"enqueue_config\('training_[0-9.]+/[^']*'\.format\(v\['value'\]\)\)\s*;?\s*")


def official_files(benchmark: str, ruleset: str) -> list[Path]:
    """The official configs the checker runs for a closed `benchmark` log, in order."""
    folder = CHECKER_DIR / f"training_{ruleset}"
    files = [folder / "common.yaml", folder / "closed_common.yaml", folder / f"closed_{benchmark}.yaml"]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"official rules file {f} not found: is ruleset {ruleset} "
                                    f"valid for benchmark {benchmark}? ({RULESETS})")
    return files


def derive_rules_text(spec: DerivedRulesSpec) -> str:
    """The YAML text of the derived rules (header comment stating provenance)."""
    if spec.ruleset not in RULESETS.get(spec.benchmark, ()):
        raise ValueError(f"no derived rules for {spec.benchmark} ruleset {spec.ruleset}; "
                         f"supported: {RULESETS}")
    if (spec.eval_samples is None) != (spec.benchmark not in OFFICIAL_EVAL_SAMPLES):
        raise ValueError(f"eval_samples is required for exactly {list(OFFICIAL_EVAL_SAMPLES)}, "
                         f"got {spec.eval_samples!r} for {spec.benchmark}")
    if (spec.scale is None) != (spec.benchmark != "dlrmv4"):
        raise ValueError(f"a Dlrmv4Scale is required exactly for dlrmv4, got {spec.scale!r} "
                         f"for {spec.benchmark}")
    files = official_files(spec.benchmark, spec.ruleset)
    records = _flatten([yaml.load(f.read_text(), Loader=yaml.BaseLoader) for f in files])
    keys = {r["KEY"]["NAME"]: r["KEY"] for r in records if "KEY" in r}
    _require_closed_division_and_benchmark(keys, spec.benchmark)
    if spec.scale is not None:
        _replace_dlrmv4_numbers(records[0]["BEGIN"], keys, spec.target, spec.scale)
    else:
        _replace_once(keys["eval_accuracy"], "ATLEAST_ONE_CHECK",
                      f">= {OFFICIAL_TARGET[spec.benchmark]} ", f">= {spec.target!r} ")
    if spec.eval_samples is not None:
        _replace_once(keys["eval_samples"], "CHECK",
                      f"== {OFFICIAL_EVAL_SAMPLES[spec.benchmark]} ", f"== {spec.eval_samples} ")
    return _header(spec, files) + yaml.dump(records, Dumper=_BlockDumper, sort_keys=False,
                                            width=100, allow_unicode=True)


def write_derived_rules(spec: DerivedRulesSpec, folder: Path) -> Path:
    """Write the derived rules under `folder/training_<ruleset>/`; return the path."""
    path = Path(folder) / f"training_{spec.ruleset}" / spec.filename()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(derive_rules_text(spec))
    return path


def _flatten(configs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    begin_code: list[str] = []
    end: dict[str, list[str]] = {"PRE": [], "CHECK": []}
    keys: dict[str, dict[str, Any]] = {}
    for config in configs:
        for record in config or []:
            kind, body = next(iter(record.items()))
            if kind == "BEGIN":
                begin_code.append(body["CODE"].strip())
            elif kind == "END":
                if "PRE" in body:
                    end["PRE"].append(body["PRE"].strip())
                checks = body.get("CHECK", [])
                end["CHECK"] += [checks] if isinstance(checks, str) else checks
            elif kind == "KEY":
                keys[body["NAME"]] = _without_enqueue(dict(body))  # later config wins
            else:
                raise ValueError(f"unexpected record {kind!r} in the official rules")
    records: list[dict[str, Any]] = [{"BEGIN": {"CODE": "\n".join(begin_code) + "\n"}}]
    records += [{"KEY": body} for body in keys.values()]
    if end["CHECK"] or end["PRE"]:
        end_body: dict[str, Any] = {}
        if end["PRE"]:
            end_body["PRE"] = "\n".join(end["PRE"]) + "\n"
        end_body["CHECK"] = [c.strip() + "\n" for c in end["CHECK"]]
        records.append({"END": end_body})
    return records


def _without_enqueue(key: dict[str, Any]) -> dict[str, Any]:
    post = key.get("POST")
    if post and "enqueue_config" in post:
        stripped, n = _ENQUEUE.subn("", post)
        if n != 1 or "enqueue_config" in stripped:
            raise ValueError(f"unexpected enqueue_config form in POST of {key['NAME']}: {post!r}")
        if stripped.strip():
            key["POST"] = " " + stripped.strip() + " "
        else:
            del key["POST"]
    return key


def _require_closed_division_and_benchmark(keys: dict[str, dict[str, Any]], benchmark: str) -> None:
    # These were the conditions under which the official checker loaded the files we inlined.
    _add_check(keys["submission_division"], "v['value'] == 'closed'")
    _add_check(keys["submission_benchmark"], f"v['value'] == '{benchmark}'")


def _add_check(key: dict[str, Any], check: str) -> None:
    current = key.get("CHECK", [])
    key["CHECK"] = ([current] if isinstance(current, str) else list(current)) + [check]


def _replace_once(key: dict[str, Any], field: str, old: str, new: str) -> None:
    text = key[field]
    if text.count(old) != 1:
        raise ValueError(f"expected {old.strip()!r} once in {key.get('NAME', 'BEGIN')}.{field}, "
                         f"got {text!r}")
    key[field] = text.replace(old, new)


# Where closed_dlrmv4.yaml states each number of the full-size run: (key or BEGIN,
# field, official text, the text with the small run's value).
def _dlrmv4_numbers(target: float, s: Dlrmv4Scale) -> list[tuple[str, str, str, str]]:
    first_eval = ("math.floor((4480 * v['value'] + 135331840) / 3)",
                  "math.floor((4480 * v['value'] + 135331840) / 3)" if s.skip_eval_epoch_pct is None
                  else f"max(1, math.ceil({s.skip_eval_epoch_pct!r} * s['train_samples'] "
                       "/ v['value'])) * v['value']")
    return [
        ("BEGIN", "CODE", "'train_samples': 2290835423,", f"'train_samples': {s.train_samples},"),
        ("BEGIN", "CODE", "'target_accuracy': 0.75,", f"'target_accuracy': {target!r},"),
        ("max_sequence_length", "CHECK", "== 4096 ", f"== {s.max_sequence_length} "),
        ("opt_learning_rate_warmup_steps", "CHECK", "== 24000 ", f"== {s.warmup_steps} "),
        ("eval_every_data_pct", "CHECK", "== 0.001 ", f"== {s.eval_every_data_pct!r} "),
        ("global_batch_size", "POST", "0.001 * s['train_samples']",
         f"{s.eval_every_data_pct!r} * s['train_samples']"),
        ("global_batch_size", "POST", *first_eval),
        ("global_batch_size", "POST", "0.5e-6 * v['value']", f"{0.5 * s.reference_lr!r} * v['value']"),
        ("global_batch_size", "POST", "1.5e-6 * v['value']", f"{1.5 * s.reference_lr!r} * v['value']"),
    ]


def _replace_dlrmv4_numbers(begin: dict[str, Any], keys: dict[str, dict[str, Any]],
                            target: float, scale: Dlrmv4Scale) -> None:
    for where, field, old, new in _dlrmv4_numbers(target, scale):
        _replace_once(begin if where == "BEGIN" else keys[where], field, old, new)


def _header(spec: DerivedRulesSpec, files: list[Path]) -> str:
    sources = "\n".join(
        f"#   {f.relative_to(CHECKER_DIR)}  sha256 {hashlib.sha256(f.read_bytes()).hexdigest()[:16]}"
        for f in files)
    size = (f"\n#   - eval_samples must equal {spec.eval_samples} "
            f"(official: {OFFICIAL_EVAL_SAMPLES[spec.benchmark]})" if spec.eval_samples else "")
    if spec.scale is not None:
        s = spec.scale
        first = ("the official fit" if s.skip_eval_epoch_pct is None else
                 f"first grid point at or after {s.skip_eval_epoch_pct!r} of train_samples")
        size += (f"\n#   - train_samples {s.train_samples} (official: 2290835423), sets the eval grid"
                 f"\n#   - max_sequence_length {s.max_sequence_length} (official: 4096)"
                 f"\n#   - opt_learning_rate_warmup_steps {s.warmup_steps} (official: 24000)"
                 f"\n#   - learning-rate band 0.5-1.5 x {s.reference_lr!r} x global batch / 8192"
                 " (official: 1e-6)"
                 f"\n#   - eval_every_data_pct {s.eval_every_data_pct!r} (official: 0.001)"
                 f"\n#   - first eval: {first} (official: floor((4480 x batch + 135331840) / 3) "
                 "samples)")
    return (
        "# UNOFFICIAL compliance rules -- NOT the MLPerf rules. For small runs only.\n"
        f"# Benchmark {spec.benchmark}, closed division, ruleset {spec.ruleset}.\n"
        f"# Generated by `python -m dlrmtrain.mlperf.rules.derive` from mlperf-logging "
        f"{version('mlperf-logging')}:\n{sources}\n"
        "# Changes from the official rules:\n"
        "#   - the three files are flattened into one (their enqueue_config chain is replaced\n"
        "#     by checks that the log is closed division and of this benchmark)\n"
        f"#   - eval_accuracy target {spec.target!r} (official: {OFFICIAL_TARGET[spec.benchmark]})"
        f"{size}\n"
        "# Use with an absolute path: python -m mlperf_logging.compliance_checker --usage training\n"
        f"#   --ruleset {spec.ruleset} --config /abs/path/to/this.yaml <log>\n\n"
    )


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (the rules' Python code) as readable `|` blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _str_representer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RULES_DIR,
                        help="folder to write into (default: the package's rules folder)")
    args = parser.parse_args(argv)
    for spec in COMMITTED_SPECS:
        print(write_derived_rules(spec, args.out))


if __name__ == "__main__":
    main()
