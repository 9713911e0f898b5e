"""Where a run's codec runs, per collection kind: the placement, asked once.

A codec's work on an embedding all-to-all runs on one of two sides (`codec.Side`):

- `owner`: its output dist, built by the codec (`EmbeddingCommCodec.make_output_dist`) and put
  on TorchRec's sharded module by the codec sharders (embeddingbag.py, embedding.py); every id
  crosses the id all-to-all, the dist sends back what the codec keeps;
- `sample`: where the batch is made, on the loader's prefetch thread: the codec's `SampleSide`
  turns each batch into what TorchRec's stock dists carry (`dedup`: each feature's distinct
  bags, or each table's distinct ids), gives the sharder whose module takes it and what to
  install after sharding; a codec that chooses per batch (`auto`) also gives the picker the
  trainer asks for each training batch.

Each codec declares whether it dedups and where it may run (`EmbeddingCommCodec.dedups`,
`.sides`); the config names the side of a run whose codec dedups (`PLACEMENT_KEY`: `owner`, or
`source` for the sample side). Left unset, `resolve` picks the sample side where the run's codec
dedups and the path carries it, else the owner with a reason (`note`: the line the run prints);
an explicit sample side the path cannot take is refused naming the key (`check`). The schema,
validation and the run identity read the resolved value through this module (`value_of`,
`unresolved`, labels.PLACEMENT_KEY). `Placement(comm, kind)` is then what the sharding, the
loaders and the trainer ask: the sharder, what to install after sharding, the loader's batch
transform and the run's counters (`stats.CommCounters`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torchrec.distributed.types import ModuleSharder

from dlrmtrain.comm.codec import CollectionKind, EmbeddingCommCodec, Side
from dlrmtrain.comm.embedding import CodecEmbeddingCollectionSharder
from dlrmtrain.comm.embeddingbag import CodecEmbeddingBagCollectionSharder
from dlrmtrain.comm.labels import PLACEMENT_KEY
from dlrmtrain.comm.lookups import count_lookups
from dlrmtrain.comm.registry import codecs_that, find_codec, get_codec
from dlrmtrain.comm.stats import CommCounters
from dlrmtrain.comm.stock_bytes import count_sequence_stock_dists, count_stock_dists
from dlrmtrain.comm.topology import Hierarchy
from dlrmtrain.config.schema import CommConfig

FIELD = PLACEMENT_KEY.split(".")[1]
OWNER_SHARDERS = {"pooled": CodecEmbeddingBagCollectionSharder, "sequence": CodecEmbeddingCollectionSharder}
"""each collection kind's sharder at the owner side (its `for_codecs` gives TorchRec's own for `none`)"""
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


def _dedups_at_sample(codec: EmbeddingCommCodec) -> bool:
    return codec.dedups and "sample" in codec.sides


def _blocker(comm: CommConfig, kind: CollectionKind, optimizer: str | None) -> tuple[str, str] | None:
    """Why the sample side cannot carry this run: (the error for an explicit one, naming the
    key; the short reason an unset key prints), or None. `optimizer` None: not checked. Tables
    whose codec does not dedup travel whole beside the run's codec where its sample side keeps
    tables whole (pooled); elsewhere every table takes the run's codec."""
    run = find_codec(comm.codec)
    if run is None or not _dedups_at_sample(run):
        able = " or ".join(codecs_that(_dedups_at_sample))
        why = ("dedups at the owner only" if run is not None and run.dedups
               else f"{kind} tables dedup at the source under {able} only")
        return (f"{WHERE} needs comm.codec: {able}, got {comm.codec!r} ({why}); use {PLACEMENT_KEY}: owner",
                f"comm.codec: {comm.codec}: {why}")
    whole = run.sample_side(kind).keeps_tables_whole
    for table, name in comm.table_codecs.items():
        other = find_codec(name)
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
    if not any(codec.dedups for codec in map(find_codec, names) if codec is not None):
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


class Placement:
    """Where the run's codec runs on `kind` embeddings, and what that needs: asked once per
    run by the sharding (`sharder`, `after_sharding`) and the trainer (`feed`, the loader's
    batch transform); `counters` is the run's one registry of all-to-all counters."""

    def __init__(self, comm: CommConfig, kind: CollectionKind) -> None:
        self.comm, self.kind = comm, kind
        self.side: Side = side_of(comm)
        check(comm, kind)
        self.counters = CommCounters()
        self._sample = (get_codec(comm.codec).for_run(comm.auto).sample_side(kind)
                        if self.side == "sample" else None)

    def sharder(self, fused_params: dict[str, Any], device_type: str = "cpu") -> ModuleSharder:
        """The sharder of the run's `kind` collection: the sample side's (TorchRec's stock dists
        carry its batches), else TorchRec's own for `none` everywhere or the codec sharder."""
        if self._sample is not None:
            return self._sample.sharder(fused_params)
        c = self.comm
        return OWNER_SHARDERS[self.kind].for_codecs(c.codec, dict(c.table_codecs), fused_params, device_type,
                                                    Hierarchy.of(c), c.auto, self.counters)

    def after_sharding(self, model: nn.Module) -> CommCounters:
        """Install what the side needs on the sharded `model`, and count what TorchRec's stock
        dists carry (at the sample side: the codec's batches) and what each lookup takes."""
        carried = "none"
        if self._sample is not None:
            self._sample.install(model)
            carried = self.comm.codec
        if self.kind == "pooled":
            count_stock_dists(model, self.counters, carried)
            count_lookups(model, self.counters)  # ids and rows each lookup takes, every codec alike
        else:
            count_sequence_stock_dists(model, self.counters, carried)
        return self.counters

    def feed(self, model: nn.Module, data: Any, device: torch.device) -> Any:
        """At the sample side: give `data`'s loaders (`Datasets.set_sparse_transform`) the codec's
        batch transform for the sharded `model`, and return its per-batch picker (`pick(batch)`,
        `pick_for_eval`, `step_ended`; `auto`), None where every batch is transformed. At the
        owner: nothing, None."""
        if self._sample is None:
            return None
        picker = self._sample.picker(device, self.counters)
        data.set_sparse_transform(self.batch_transform(model), keep_full=picker is not None)
        return picker

    def batch_transform(self, model: nn.Module) -> Callable:
        """The sample side's batch transform for the sharded `model` (what `feed` gives the
        loaders): tables whose codec does not dedup travel whole where the side keeps them so."""
        if self._sample is None:
            raise ValueError(f"{PLACEMENT_KEY}: owner: the batches are not transformed where they are made")
        whole = frozenset(t for t, name in self.comm.table_codecs.items() if not get_codec(name).dedups)
        return self._sample.transform(model, whole)
