"""Where a run's codec runs, per collection kind: the config's choice (`PLACEMENT_KEY`), its
check and its resolution, torch-free (the CLI checks a config before any rank starts).

A codec's work on an embedding all-to-all runs on one of two sides (`declarations.Side`): the
`owner`, through its output dist, or the `sample` side, where the batch is made (comm/placement.py
builds either). Each codec declares whether it dedups and where it may run
(`CodecDeclaration.dedups`, `.sides`); the config names the side of a run whose codec dedups
(`PLACEMENT_KEY`: `owner`, or `source` for the sample side). Left unset, `resolve` picks the
sample side where the run's codec dedups and the path carries it, else the owner with a reason
(`note`: the line the run prints); an explicit sample side the path cannot take is refused
naming the key (`check`). The schema, validation and the run identity read the resolved value
through this module (`value_of`, `unresolved`, labels.PLACEMENT_KEY).
"""

from __future__ import annotations

from collections.abc import Callable

from dlrmtrain.comm.declarations import CodecDeclaration, CollectionKind, Side, codecs_that, find_declaration
from dlrmtrain.comm.labels import PLACEMENT_KEY
from dlrmtrain.config.schema import CommConfig

FIELD = PLACEMENT_KEY.split(".")[1]
"""the `CommConfig` field that holds the side"""
VALUES: dict[str, Side] = {"owner": "owner", "source": "sample"}
"""the config's values and the side each names"""
SAMPLE_VALUE = next(v for v, side in VALUES.items() if side == "sample")
WHERE = f"{PLACEMENT_KEY}: {SAMPLE_VALUE}"
"""how errors name an explicit sample side"""


def value_of(comm: CommConfig) -> str | None:
    """The config's value (None: unset, to resolve)."""
    return getattr(comm, FIELD)


def set_value(comm: CommConfig, value: str) -> None:
    """Write the resolved value (validation.resolve_config, on its copy of the config)."""
    setattr(comm, FIELD, value)


def unresolved(comm: CommConfig) -> list[str]:
    """The placement key when `resolve_config` has yet to fill it in, else nothing."""
    return [PLACEMENT_KEY] if value_of(comm) is None else []


def side_of(comm: CommConfig) -> Side:
    """The side a resolved config names; an unset or unknown value is refused by name."""
    value = value_of(comm)
    if value is None:
        raise ValueError(f"{PLACEMENT_KEY} is unset: resolve the config first (validation.resolve_config), "
                         f"or give {PLACEMENT_KEY}: {' or '.join(VALUES)}")
    if value not in VALUES:
        raise ValueError(f"{PLACEMENT_KEY}: {value!r} is not one of {', '.join(VALUES)}")
    return VALUES[value]


def _dedups_at_sample(codec: CodecDeclaration) -> bool:
    return codec.dedups and "sample" in codec.sides


def _blocker(comm: CommConfig, kind: CollectionKind, optimizer: str | None) -> tuple[str, str] | None:
    """Why the sample side cannot carry this run: (the error for an explicit one, naming the
    key; the short reason an unset key prints), or None. `optimizer` None: not checked. Tables
    whose codec does not dedup travel whole beside the run's codec where its sample side keeps
    tables whole (pooled); elsewhere every table takes the run's codec."""
    run = find_declaration(comm.codec)
    if run is None or not _dedups_at_sample(run):
        able = " or ".join(codecs_that(_dedups_at_sample))
        why = ("dedups at the owner only" if run is not None and run.dedups
               else f"{kind} tables dedup at the source under {able} only")
        return (f"{WHERE} needs comm.codec: {able}, got {comm.codec!r} ({why}); use {PLACEMENT_KEY}: owner",
                f"comm.codec: {comm.codec}: {why}")
    whole = kind in run.whole_beside_at_sample
    for table, name in comm.table_codecs.items():
        other = find_declaration(name)
        travels_whole = other is not None and not other.dedups and "sample" in other.sides
        if name != comm.codec and not (whole and travels_whole):
            rule = (f"it carries {comm.codec!r} and per-table codecs that keep their tables whole" if whole
                    else f"the run's codec covers every table of the {kind} collection at the source")
            return (f"comm.table_codecs.{table}: {name!r} cannot run under {WHERE}: {rule}",
                    f"comm.table_codecs.{table}: {name}: not carried at the source")
    if comm.hierarchy != "flat":
        return (f"{WHERE} runs over comm.hierarchy: flat only; comm.hierarchy: {comm.hierarchy} takes "
                f"{PLACEMENT_KEY}: owner", f"comm.hierarchy: {comm.hierarchy}: two levels dedup at the owner")
    if kind == "pooled" and optimizer == "adagrad":  # fbgemm's TBE asserts it in its variable-batch metadata
        return (f"{WHERE}: fbgemm's variable-batch TBE does not train EXACT_ADAGRAD tables (optim.name: "
                f"adagrad; it takes SGD, row-wise Adagrad and Adam); use optim.name: sgd or {PLACEMENT_KEY}: owner",
                "optim.name: adagrad: fbgemm's variable-batch TBE refuses EXACT_ADAGRAD")
    return None


def check(comm: CommConfig, kind: CollectionKind, optimizer: str | None = None) -> None:
    """Refuse an explicit sample side the run's path does not carry, naming the key (an unset
    or owner-side value passes: `resolve` picks a value the path takes)."""
    if value_of(comm) is None or side_of(comm) == "owner":
        return
    blocked = _blocker(comm, kind, optimizer)
    if blocked is not None:
        raise ValueError(blocked[0])


def resolve(comm: CommConfig, kind: CollectionKind, optimizer: str,
            row_wise: Callable[[], tuple[int, int]] = lambda: (0, 0)) -> tuple[str, str | None]:
    """What an unset placement becomes, and why when it is the owner for a reason: the sample
    side where this run's codec dedups and its path carries it (the rules `check` enforces on
    an explicit one), else the owner (reason None when no codec of the run dedups: the key then
    does nothing). `row_wise()`: (row-wise tables, tables that cross the all-to-all) in the
    config's plan, asked last."""
    owner = next(v for v, side in VALUES.items() if side == "owner")
    names = (comm.codec, *comm.table_codecs.values())
    if not any(codec.dedups for codec in map(find_declaration, names) if codec is not None):
        return owner, None
    blocked = _blocker(comm, kind, optimizer)
    reason = None if blocked is None else blocked[1]
    if reason is None and kind == "pooled" and 2 * (rows := row_wise())[0] > rows[1]:
        # Row-wise tables at the source: TorchRec's reduce-scatter sends every owner's (zero)
        # partial of every distinct bag, world size x the distinct rows, where owner-side dedup
        # sends the distinct rows once; rows outweigh ids (dim 128 fp32: 512 B against 8 B), so
        # when most tables are row-wise the output's growth with world size outweighs the ids
        # and lookups saved. A few row-wise tables among table-wise ones stay at the source.
        reason = (f"sharding: {rows[0]} of {rows[1]} tables row-wise: at the "
                  f"source their output sends world size x the distinct rows")
    return (owner, reason) if reason else (SAMPLE_VALUE, None)


def note(value: str, reason: str | None) -> str | None:
    """The line a run prints when its unset placement resolved to `value` for `reason`."""
    return f"{PLACEMENT_KEY}: {value} ({reason})" if reason else None
