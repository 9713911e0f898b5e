"""The Workload interface: what one model family decides, asked by validation, the
builders, the trainer and the MLPerf tools.

A family is one file in this package (a Workload per `model.arch` it serves) and its
line in registry.py. What no Workload decides is the same code for every family: the
step, evaluation (every model returns `(loss, (loss, logits, labels))`), checkpoints,
records. Nothing outside this package reads `model.arch` or names a family; it asks
the family's Workload (tests/config/test_workloads.py greps for it).

Importing the workloads brings no torch: a family's facts (its MLPerf benchmark, its
sources) are read by tools that never train (`dlrmtrain report`, the MLPerf runner);
what a family builds is imported when it is built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Mapping, Optional

from dlrmtrain.config.schema import Config

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torchrec.distributed.types import ModuleSharder

    from dlrmtrain.comm.codec import CollectionKind
    from dlrmtrain.data.datasets import Datasets
    from dlrmtrain.comm.placement import Placement
    from dlrmtrain.distributed.sharding import ShardedModel
    from dlrmtrain.models.activation_memory import ActivationMemory
    from dlrmtrain.run.machine import MemoryPart


class Workload(ABC):
    arch: str
    """The `model.arch` this workload runs."""
    sources: tuple[str, ...]
    """The `data.source` values that feed it, in the order a refusal names them."""
    family: str
    """The model family it belongs to, as a report names it: runs of one family share data,
    tables and the shapes on the wire (one Workload class per family)."""
    benchmark: str
    """The MLPerf benchmark it is logged and scored as (mlperf/benchmarks.py)."""
    collection_kind: CollectionKind = "pooled"
    """What its embedding all-to-alls carry (comm.codec.CollectionKind): pooled rows of an
    EmbeddingBagCollection, or an EmbeddingCollection's sequences. Which `comm.hierarchy`
    each can take is comm's rule (comm.codec_choice.validate_hierarchy asks it)."""
    model_scopes_its_own_autocast: bool = False
    """True: under `precision.mode: bf16` the model sets its own autocast scope inside its
    forward (precision.py), so the trainer runs the forward outside any autocast."""
    rows_follow_precision: bool = True
    """True: under `precision.mode: bf16` its lookups emit bf16 rows, so its embedding
    all-to-alls carry bf16 (precision.py); False: fp32 rows whatever the mode."""
    shrink_tables: str
    """What to change for smaller tables, as a refusal for memory says it."""
    unused_keys: tuple[str, ...] = ()
    """Keys of the shared sections it has no use for: set to anything but their default,
    its `check_model` refuses them rather than dropping them."""

    # --- what comes from the data (validation.resolve_config, on a copy) ---

    def resolve(self, cfg: Config) -> None:
        """Fill in, in place, the null keys this family's data decides; default: none."""

    def unresolved_keys(self, cfg: Config) -> list[str]:
        """The keys `resolve` would fill that are still null (empty once resolved)."""
        return []

    # --- validation.validate_config asks these in its order; errors name the key ---

    @abstractmethod
    def check_data(self, cfg: Config, world_size: int) -> None:
        """The data section for this family's sources (`data.source` is one of `sources`)."""

    @abstractmethod
    def check_model(self, cfg: Config) -> None:
        """The model section's family-specific sizes (config/checks.py holds the shared ones)."""

    def check_device(self, cfg: Config, device_type: str) -> None:
        """Refuse a model setting whose kernel cannot run on `device_type`; default: none."""

    def check_pipeline(self, cfg: Config) -> None:
        """Refuse a `run.pipeline` this family's model cannot train under; default: none."""

    def default_pipeline(self, device_type: str) -> str:
        """What `run.pipeline: auto` becomes on `device_type`: `sparse_dist` on CUDA, where
        the next batch's id all-to-all runs during this step and a dedup plan's host sync
        (its split sizes) leaves the step's critical path; `off` on CPU, where it always
        was (nothing waits on a device there: the CPU tests and benchmarks keep timing
        the plain loop)."""
        return "sparse_dist" if device_type == "cuda" else "off"

    @abstractmethod
    def table_names(self, cfg: Config) -> list[str]:
        """The embedding tables, in the model's order (per-table keys must name one)."""

    def check_sharding(self, cfg: Config) -> None:
        """Refuse a sharding type one of this family's tables cannot take beyond what the
        planner's own checks refuse (distributed/sharding_checks.check_sharding_config); default: none."""

    def table_precision(self, cfg: Config) -> str:
        """The precision its lookups emit rows in (fused_params' output dtype): the run's
        `precision.mode` where `rows_follow_precision`, else fp32."""
        return cfg.precision.mode if self.rows_follow_precision else "fp32"

    def check_hierarchy(self, cfg: Config) -> None:
        """Refuse a `comm.hierarchy` this family's all-to-alls cannot take beyond what
        comm's rule for its `collection_kind` refuses; default: none."""

    # --- the trainer's builders (through dlrmtrain.workloads) ---

    def table_widths(self, cfg: Config, rows: Mapping[str, int]) -> dict[str, int]:
        """Table → its width; default: every table `model.embedding_dim` wide (both
        shipped families' tables are)."""
        return {name: cfg.model.embedding_dim for name in rows}

    def dense_parameters(self, cfg: Config, rows: Mapping[str, int]) -> int:
        """Parameters outside the embedding tables (every rank holds them all): the model
        built on the meta device (nothing allocated), less its tables."""
        import torch

        with torch.random.fork_rng(devices=[]):  # the builder seeds; the run's own build seeds again
            model = self.build_model(cfg, rows, torch.device("meta"))
        widths = self.table_widths(cfg, rows)
        return (sum(p.numel() for p in model.parameters())
                - sum(n * widths[name] for name, n in rows.items()))

    @abstractmethod
    def activation_memory(self, cfg: Config, rows: Mapping[str, int], local_batch: int,
                          device_type: str) -> ActivationMemory:
        """A training step's activations on one rank at `local_batch` samples, by the family's
        formula (models/*activations.py): nothing is allocated."""

    def check_memory(self, cfg: Config, rows: Mapping[str, int], world_size: int,
                     device: torch.device, available: Optional[int] = None) -> None:
        """Refuse, in one line naming what does not fit, a run whose rank cannot hold its share
        of the tables (fp32 weights and optimizer state, spread evenly: a lower bound), the
        dense parameters with their gradients and state, and a training step's activations at
        the local batch (run/machine.py); `available`: the rank's memory (default: what this
        machine says)."""
        from dlrmtrain.run.machine import check_model_fits

        check_model_fits(self.memory_parts(cfg, rows, world_size, device.type), device, available)

    def memory_parts(self, cfg: Config, rows: Mapping[str, int], world_size: int,
                     device_type: str) -> list[MemoryPart]:
        """What each rank of a `world_size` run on `device_type` needs, by part (check_memory's)."""
        from dlrmtrain.optim.state_size import dense_optimizer_state, table_optimizer_state
        from dlrmtrain.run.machine import activation_part, dense_part, table_part

        local_batch = cfg.run.global_batch_size // world_size
        cached = {}
        if device_type == "cuda":  # CPU refuses the UVM kernel (distributed/planner.py)
            from dlrmtrain.distributed.sharding_checks import uvm_cached_tables

            cached = {t: cfg.sharding.uvm_caching.load_factor for t in uvm_cached_tables(cfg.sharding, rows)}
        return [table_part(rows, self.table_widths(cfg, rows), table_optimizer_state(cfg.optim),
                           world_size, self.shrink_tables, cached),
                dense_part(self.dense_parameters(cfg, rows), dense_optimizer_state(cfg.optim)),
                activation_part(self.activation_memory(cfg, rows, local_batch, device_type))]

    # --- `dlrmtrain plan`: a cluster sized before any data is read or rank started ---

    @abstractmethod
    def planned_table_rows(self, cfg: Config) -> dict[str, int]:
        """Table → rows as a run of `cfg` (resolved) would size them, from the config alone
        where the data is not at hand, in the model's table order."""

    def lighter_settings(self, cfg: Config, device_type: str) -> list[tuple[str, Config]]:
        """Settings that train the same model with fewer activations on `device_type`, each as
        `key=value` and the config it makes; default: none."""
        return []

    @abstractmethod
    def embedding_sharder(self, cfg: Config, device_type: str) -> tuple[ModuleSharder, str]:
        """The sharder `shard` gives DistributedModelParallel on `device_type`, and the path of
        the embedding module it shards."""

    @abstractmethod
    def build_datasets(self, cfg: Config, rank: int, world_size: int,
                       pin_memory: bool = False) -> Datasets:
        """This rank's train and eval batches, in pinned memory with `pin_memory`."""

    @abstractmethod
    def build_model(self, cfg: Config, rows: Optional[Mapping[str, int]],
                    dense_device: torch.device) -> nn.Module:
        """The single-device training module, tables on meta; `rows`: table → rows in
        the model's table order (`Datasets.table_rows`)."""

    @abstractmethod
    def shard(self, model: nn.Module, cfg: Config, device: torch.device,
              world_size: int, placement: Placement) -> ShardedModel:
        """`model` sharded by DistributedModelParallel with the configured codecs where `placement`
        (the run's, of this family's collection kind) puts them; the plan's text and the run's
        all-to-all counters."""
