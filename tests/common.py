"""Small configs shared by the tests (tiny tables, few steps, fast on 2 cores)."""

from __future__ import annotations

from dlrmtrain.config import load_config
from dlrmtrain.config.schema import Config

TINY = [
    "model.embedding_dim=8", "model.bottom_mlp=[16,8]", "model.top_mlp=[16,8,1]",
    "data.table_sizes=" + str([50, 7, 300, 120, 9, 3, 80, 20, 2, 150, 60, 200, 40,
                               5, 70, 260, 4, 30, 25, 2, 240, 6, 8, 90, 11, 75]),
    "data.synthetic.num_train_samples=4096", "data.synthetic.num_eval_samples=1024",
    "run.global_batch_size=256", "eval.batch_size=512",
    "logging.progress_bar=false", "logging.metrics_every_steps=1",
    "optim.name=adagrad", "optim.lr=0.05",
]


def tiny_overrides(tmp_dir: str, *overrides: str) -> list[str]:
    return TINY + [f"run.output_dir={tmp_dir}", *overrides]


def tiny_config(tmp_dir: str, *overrides: str) -> Config:
    return load_config(None, tiny_overrides(tmp_dir, *overrides))


def train_on_rank(rank: int, world_size: int, config: str | None, overrides: list[str]) -> dict:
    """Validate `config` + overrides, train on this rank, return the summary as a dict.
    Module level, so `run_ranks` can spawn it."""
    from dlrmtrain.validation import resolve_config, validate_config
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.trainer import Trainer

    cfg = resolve_config(load_config(config, overrides))
    validate_config(cfg, world_size)
    trainer = Trainer(cfg, init_distributed("cpu"))
    summary = trainer.train().as_dict()
    trainer.close()
    del trainer  # drop the sharded model before the process group goes away
    return summary
