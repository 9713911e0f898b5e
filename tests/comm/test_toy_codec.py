"""A new lossless codec runs on the default path with no file of the package changed: it is
registered (comm/registry.py's `register_codec`, as its one line there would), its properties
placed it (it does not dedup: owner side, the placement unset and resolved), and the run trains
through the codec's own output dist, bitwise `none`'s, its counters in the run's comm stats."""

from __future__ import annotations

import torch.nn as nn

from dlrmtrain.comm.codec import CollectionKind, DistSpec, EmbeddingCommCodec
from dlrmtrain.comm.stats import DistCommStats
from dlrmtrain.config import load_config
from tests.common import tiny_overrides
from tests.multiproc import run_ranks


class _PassingDist(nn.Module):
    """The stock dist, called through: what crosses the wire is TorchRec's, counted per pass."""

    def __init__(self, spec: DistSpec) -> None:
        super().__init__()
        self.stock = spec.stock_dist
        self.stats = DistCommStats(codec="toy", sharding_type=spec.sharding_type)
        for table in sorted(spec.tables):  # the tables it carries, in the run's comm stats
            self.stats.table(table)

    def forward(self, *args, **kwargs):
        self.stats.steps += 1
        return self.stock(*args, **kwargs)

    def counted_bytes(self) -> DistCommStats:
        return self.stats


class ToyCodec(EmbeddingCommCodec):
    """Lossless, no dedup, at the owner only, one level."""

    name = "toy"
    lossless = True
    dedups = False
    sides = frozenset({"owner"})
    runs_under_two_levels = False

    def supports(self, sharding_type: str, kind: CollectionKind = "pooled") -> bool:
        return kind == "pooled"

    def make_output_dist(self, spec: DistSpec) -> nn.Module:
        return _PassingDist(spec)


def _train(rank: int, world_size: int, out_dir: str) -> dict:
    from dlrmtrain.comm.registry import register_codec
    from dlrmtrain.comm.stats import collect_comm_stats
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.trainer import Trainer
    from dlrmtrain.validation import resolve_config, unresolved_keys, validate_config

    register_codec(ToyCodec())
    out = {}
    for codec in ("none", "toy"):
        loaded = load_config(None, tiny_overrides(out_dir, "run.max_steps=4", "eval.enabled=false",
                                                  f"run.name={codec}"))
        loaded.comm.codec = codec  # the schema's list of names is the one other line a codec adds
        unset = unresolved_keys(loaded)
        cfg = resolve_config(loaded)
        validate_config(cfg, world_size)
        trainer = Trainer(cfg, init_distributed("cpu"))
        summary = trainer.train().as_dict()
        out[codec] = {"losses": summary["losses"], "unset": unset, "resolved": cfg.comm,
                      "toy_dists": [d.stats.steps for d in trainer.comm_counters.of_type(_PassingDist)],
                      "stats": collect_comm_stats(trainer.comm_counters)}
        trainer.close()
        del trainer
    return out


def test_a_registered_lossless_codec_trains_on_the_default_path_like_none(tmp_path):
    rank0, _ = run_ranks(_train, 2, str(tmp_path), timeout=300)
    none, toy = rank0["none"], rank0["toy"]
    assert toy["unset"] == none["unset"] and toy["unset"]  # the placement was left to resolve
    assert toy["resolved"].dedup_at == "owner"  # it does not dedup: its dists run at the owner
    assert toy["toy_dists"] and all(steps >= 4 for steps in toy["toy_dists"]), toy["toy_dists"]
    assert "toy" in toy["stats"]["codecs"]
    assert toy["losses"] == none["losses"]
