"""Derive UNOFFICIAL compliance rules for small runs from the installed official ones.

The official checker hard-codes what only a full-size run reaches: an
``eval_accuracy`` >= 0.8025 (dlrm) / >= 0.80275 (dlrm_dcnv2) and, for
dlrm_dcnv2, ``eval_samples == 89137319``. A small run needs the same rules with
its own target and eval size. This module builds them from the files the
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
   for dlrm_dcnv2, the number in ``eval_samples``'s CHECK.

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
    files = official_files(spec.benchmark, spec.ruleset)
    records = _flatten([yaml.load(f.read_text(), Loader=yaml.BaseLoader) for f in files])
    keys = {r["KEY"]["NAME"]: r["KEY"] for r in records if "KEY" in r}
    _require_closed_division_and_benchmark(keys, spec.benchmark)
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
        raise ValueError(f"expected {old.strip()!r} once in {key['NAME']}.{field}, got {text!r}")
    key[field] = text.replace(old, new)


def _header(spec: DerivedRulesSpec, files: list[Path]) -> str:
    sources = "\n".join(
        f"#   {f.relative_to(CHECKER_DIR)}  sha256 {hashlib.sha256(f.read_bytes()).hexdigest()[:16]}"
        for f in files)
    size = (f"\n#   - eval_samples must equal {spec.eval_samples} "
            f"(official: {OFFICIAL_EVAL_SAMPLES[spec.benchmark]})" if spec.eval_samples else "")
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
