"""Strict YAML → Config loading with `section.key=value` command-line overrides.

Defaults < YAML file < overrides. Unknown keys and values of the wrong type
raise `ConfigError` naming the dotted key (and the file), before any process
group exists.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from dlrmtrain.config.schema import Alias, Config, Refused


class ConfigError(ValueError):
    """A configuration problem, with the dotted key that caused it."""


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one YAML mapping (PyYAML would keep the last silently)."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"line {line}: key {key!r} given twice in one mapping "
                         f"(first at line {first_line})")
        self.key, self.line, self.first_line = key, line, first_line


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping, and also reads
    `1e-3` and `5E+4` as numbers: YAML 1.1 (PyYAML) wants a dot in a float, so
    `optim.lr=1e-3` would otherwise be a string."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges are meant to be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in first_line:
                    raise DuplicateKey(key, line, first_line[key])
            except TypeError:  # an unhashable key: SafeLoader reports it below
                continue
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return True, args[0]
    return False, tp


def _check_choice(value: Any, tp: Any, key: str) -> Any:
    """A Literal field: the value must be one of its arguments (Refused metadata says why not)."""
    refused: tuple[Refused, ...] = ()
    aliases: tuple[Alias, ...] = ()
    if typing.get_origin(tp) is typing.Annotated:
        tp, *extras = typing.get_args(tp)
        refused = tuple(e for e in extras if isinstance(e, Refused))
        aliases = tuple(e for e in extras if isinstance(e, Alias))
    allowed = typing.get_args(tp)
    if value in allowed and isinstance(value, str):
        return value
    for a in aliases:  # `is`-exact for bools: 1 is not an alias of true
        if value is a.value or (type(value) is type(a.value) and value == a.value):
            return a.means
    for r in refused:
        if value == r.value:
            raise ConfigError(f"{key}: {value} is not supported: {r.reason}")
    raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")


def _is_choice(tp: Any) -> bool:
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return typing.get_origin(tp) is typing.Literal


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotated type; return it in that type."""
    optional, tp = _is_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key}: null is not allowed (expected {_type_name(tp)})")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping (section), got {type(value).__name__}")
        return _build(tp, value, key)
    if _is_choice(tp):
        return _check_choice(value, tp, key)
    origin = typing.get_origin(tp)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of {_type_name(item_tp)}, got {value!r}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {_coerce(k, key_tp, f"{key} key"): _coerce(v, val_tp, f"{key}.{k}")
                for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return _non_negative(value, key)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return _non_negative(float(value), key)
    if tp is str:
        if isinstance(value, bool):  # YAML 1.1 reads on/off/yes/no as true/false
            raise ConfigError(f"{key}: expected a string, got {value!r} (YAML reads on, off, "
                              f"yes and no as true/false: quote the text, e.g. {key}='off')")
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported field type {tp!r}")  # schema bug


def _non_negative(value: int | float, key: str) -> int | float:
    # No setting in the schema has a meaning below zero (rates, steps, epochs, seeds,
    # sizes, timeouts): a negative value is a typo that would crash every rank later.
    if value < 0:
        raise ConfigError(f"{key}: must not be negative, got {value!r}")
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls, include_extras=True)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"unknown key {where}{unknown[0]} (known in "
                          f"{prefix or 'top level'}: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k)
              for k, v in values.items()}
    return cls(**kwargs)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {p} is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value` → (dotted key, YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: the key must be section.key (or section=PRESET)")
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except DuplicateKey as e:
        raise ConfigError(f"override {key}: key {e.key!r} given twice in {raw!r}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {e}") from None
    return key, value


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_yaml_tree(path: Path, chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The file's mapping; a top-level `base: other.yaml` (relative to this file)
    is read first and this file's keys are merged over it."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if path.resolve() in chain:
        raise ConfigError(f"{path}: `base` chain loops back to itself")
    try:
        loaded = _load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                          f"{e.start}); save the file as UTF-8") from None
    except DuplicateKey as e:
        raise ConfigError(f"{path}:{e.line}: key {e.key!r} given twice in one mapping (first at "
                          f"line {e.first_line}); give each key once") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    base = loaded.pop("base", None)
    if base is None:
        return loaded
    bases = [base] if isinstance(base, str) else base
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{path}: base: expected a file name or a list of them, got {base!r}")
    tree: dict[str, Any] = {}
    for name in bases:  # later bases override earlier ones, the file overrides them all
        tree = _deep_merge(tree, _read_yaml_tree(path.parent / name, chain + (path.resolve(),)))
    return _deep_merge(tree, loaded)


def preset_path(config_path: str | Path | None, section: str, name: str) -> Path:
    """`section=NAME` → `<config's folder>/<section>/NAME.yaml` (e.g. configs/data/NAME.yaml);
    a NAME ending in .yaml is a path of its own."""
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    folder = Path(config_path).parent if config_path is not None else Path("configs")
    path = folder / section / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (folder / section).glob("*.yaml"))
        raise ConfigError(f"override {section}={name}: no preset {path}"
                          + (f" (known: {', '.join(known)})" if known else ""))
    return path


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read `path` (or start from defaults), apply overrides, type-check everything."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        tree = _read_yaml_tree(Path(path))
    section_names = {f.name for f in dataclasses.fields(Config)}
    dotted: dict[str, str] = {}  # override key -> its text, to blame the right source
    for text in overrides:
        key, value = parse_override(text)
        if "." in key:
            _set_dotted(tree, key, value)
            dotted[key] = text
        elif key in section_names and isinstance(value, str):
            # `data=criteo_terabyte`: merge a preset file over the config, in override order
            tree = _deep_merge(tree, _read_yaml_tree(preset_path(path, key, value)))
        else:
            raise ConfigError(f"override {text!r}: the key must be section.key (or SECTION=PRESET "
                              f"with SECTION one of {', '.join(sorted(section_names))})")
    try:
        return _build(Config, tree, "")
    except ConfigError as e:
        raise ConfigError(f"{_blamed(str(e), dotted) or source}: {e}") from None


_ERROR_KEY = re.compile(r"^(?:unknown key )?([\w.\[\]]+)")


def _blamed(message: str, overrides: dict[str, str]) -> str | None:
    """`override TEXT` when the key an error names was set by that override (a typo such
    as `optm.lr` is the command line's, not the config file's), else None."""
    match = _ERROR_KEY.match(message)
    key = match.group(1) if match else ""
    for dotted, text in overrides.items():
        if key == dotted or dotted.startswith(key + ".") or key.startswith(dotted + "."):
            return f"override {text!r}"
    return None


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable again with load_config)."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def parse_cli(argv: list[str]) -> tuple[str | None, list[str]]:
    """`--config PATH [section.key=value ...]` → (path, overrides)."""
    path = None
    overrides: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--config":
            path = next(it, None)
            if path is None:
                raise ConfigError("--config needs a path")
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option {arg} (use --config PATH and section.key=value)")
        else:
            overrides.append(arg)
    return path, overrides
