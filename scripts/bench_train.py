"""Training-step speed of dlrmtrain against a plain TorchRec DMP loop.

The plain loop has the shape of TorchRec's golden training example
(examples/golden_training/train_dlrm.py): DLRM on the meta device, sharder
with a fused optimizer, DistributedModelParallel, dense optimizer combined
with the fused one, forward / backward / step. Both run the same model, the
same sharding plan (so the same bytes move), the same global batch and the
same pre-built batches (data loading is not timed) on the same ranks, in
alternating blocks so machine noise hits both alike. Prints per-step times and
their ratio (goal: dlrmtrain / plain ≤ 1.02).

    python scripts/bench_train.py [--world-size 2] [--steps 30] [--rounds 3] [overrides...]

Overrides are dlrmtrain config overrides on top of configs/quickstart.yaml.
With `--vs "KEY=VALUE ..."` the second contender is dlrmtrain again with those
extra overrides instead of plain TorchRec, e.g. `--vs precision.mode=bf16`
for the bf16 / fp32 step-time ratio or `--vs comm.codec=dedup`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=30, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=3, help="alternating blocks per contender")
    p.add_argument("--config", default=str(REPO / "configs/quickstart.yaml"))
    p.add_argument("--vs", default=None, metavar="OVERRIDES",
                   help="compare against dlrmtrain with these extra overrides (space-separated)")
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def relaunch_under_torchrun(args: argparse.Namespace) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.execv(torchrun, [torchrun, "--standalone", f"--nproc_per_node={args.world_size}",
                        __file__, *sys.argv[1:]])


def build_plain_torchrec(cfg, rows, device, plan):
    """TorchRec's golden-example recipe, nothing of dlrmtrain's beyond the config values
    and the sharding plan (given, so both contenders move the same bytes)."""
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dlrmtrain.features import CAT_KEYS, TABLE_NAMES

    tables = [EmbeddingBagConfig(name=table, embedding_dim=cfg.model.embedding_dim,
                                 num_embeddings=n, feature_names=[key])
              for table, key, n in zip(TABLE_NAMES, CAT_KEYS, rows, strict=True)]
    model = DLRMTrain(DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=cfg.data.num_dense_features,
        dense_arch_layer_sizes=cfg.model.bottom_mlp,
        over_arch_layer_sizes=cfg.model.top_mlp,
        dense_device=device))
    fused = {"learning_rate": cfg.optim.lr, "eps": cfg.optim.adagrad_eps,
             "optimizer": EmbOptimType.EXACT_ADAGRAD if cfg.optim.name == "adagrad"
             else EmbOptimType.EXACT_SGD}
    sharder = EmbeddingBagCollectionSharder(fused_params=fused)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan, sharders=[sharder])
    opt_cls = torch.optim.Adagrad if cfg.optim.name == "adagrad" else torch.optim.SGD
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda params: opt_cls(params, lr=cfg.optim.lr))
    return dmp, CombinedOptimizer([dmp.fused_optimizer, dense])


def main() -> None:
    args = parse_args(sys.argv[1:])
    if "RANK" not in os.environ:
        relaunch_under_torchrun(args)

    import logging

    import torch
    import torch.distributed as dist

    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    from dlrmtrain.config import load_config
    from dlrmtrain.validation import validate_config
    from dlrmtrain.data import table_rows
    from dlrmtrain.distributed.env import init_distributed, shutdown_distributed
    from dlrmtrain.trainer import Trainer

    torch.set_num_threads(1)
    env = init_distributed("cpu")
    common = ["logging.progress_bar=false", "eval.enabled=false",
              "run.output_dir=/tmp/dlrmtrain-bench", "run.overwrite=true", *args.overrides]
    cfg = load_config(args.config, common)
    validate_config(cfg, env.world_size)
    trainer = Trainer(cfg, env)
    if args.vs:
        other_cfg = load_config(args.config, common + ["run.name=bench_vs"] + args.vs.split())
        validate_config(other_cfg, env.world_size)
        other = Trainer(other_cfg, env)
        names = ("dlrmtrain", f"dlrmtrain {args.vs}")
    else:
        plain_model, plain_opt = build_plain_torchrec(cfg, table_rows(cfg), env.device,
                                                       trainer.model.plan)
        names = ("dlrmtrain", "plain TorchRec DMP")

    needed = args.steps * args.rounds + args.steps  # + one warm-up block each
    batches = []
    epoch = 0
    while len(batches) < needed:
        batches.extend(b.to(env.device) for b in trainer.data.train_batches(epoch))
        epoch += 1

    def dlrmtrain_block(block):
        for b in block:
            trainer.train_step(b)

    def plain_block(block):
        if args.vs:  # the other dlrmtrain variant
            for b in block:
                other.train_step(b)
            return
        for b in block:
            plain_opt.zero_grad()
            loss, _ = plain_model(b)
            loss.backward()
            plain_opt.step()

    def timed(fn, block) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn(block)
        dist.barrier()
        return (time.perf_counter() - t0) / len(block)

    warm = batches[:args.steps]
    timed(dlrmtrain_block, warm), timed(plain_block, warm)
    ours, plain = [], []
    for r in range(args.rounds):
        block = batches[args.steps * (r + 1): args.steps * (r + 2)]
        order = [(dlrmtrain_block, ours), (plain_block, plain)]
        for fn, sink in (order if r % 2 == 0 else order[::-1]):
            sink.append(timed(fn, block))

    if env.is_main:
        gbs = cfg.run.global_batch_size
        t_ours, t_plain = statistics.median(ours), statistics.median(plain)
        print("\n" + "=" * 64)
        print(f"bench_train: {env.world_size} Gloo ranks, global batch {gbs}, "
              f"{args.rounds} alternating blocks of {args.steps} steps")
        print(f"  model {cfg.model.arch}, emb dim {cfg.model.embedding_dim}, "
              f"{len(cfg.data.table_sizes)} tables, optimizer {cfg.optim.name}")
        width = max(24, *(len(n) + 2 for n in names))
        print(f"  {'':{width}}{'ms/step':>10}{'samples/s':>14}   blocks (ms/step)")
        for name, t, runs in ((names[0], t_ours, ours), (names[1], t_plain, plain)):
            print(f"  {name:<{width}}{1000 * t:10.2f}{gbs / t:14,.0f}   "
                  + " ".join(f"{1000 * x:.1f}" for x in runs))
        if args.vs:
            print(f"  ratio ({names[1]}) / ({names[0]}) step time: {t_plain / t_ours:.3f}")
        else:
            print(f"  ratio dlrmtrain / plain step time: {t_ours / t_plain:.3f}  (goal ≤ 1.02)")
        print("=" * 64)
    trainer.close()
    del trainer
    if args.vs:
        other.close()
        del other
    else:
        del plain_model, plain_opt
    shutdown_distributed()


if __name__ == "__main__":
    main()
