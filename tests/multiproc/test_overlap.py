"""Sparse first (models/dlrm.py): the embedding all-to-all is in flight during the bottom MLP
(forward) and the embedding-gradient all-to-all during the bottom MLP's backward, and training gives bitwise the losses of torchrec's order, for `none` and `dedup`, table- and
row-wise, DLRM v1 and DCNv2 (2 real Gloo ranks, tiny shapes)."""

from __future__ import annotations

import pytest

from tests.common import tiny_config
from tests.multiproc import run_ranks

STEPS = 3
# table-wise tables and two row-wise ones: both kinds of output dist in one model
MIXED = "sharding.tables={t_cat_2: row_wise, t_cat_9: row_wise}"


def _train_both_orders(rank: int, world_size: int, out_dir: str) -> dict:
    import torch

    from dlrmtrain.comm.torchrec import pooled, sharded
    from dlrmtrain.distributed.env import init_distributed
    from dlrmtrain.models.dlrm import set_sparse_first
    from dlrmtrain.optim.optimizers import build_optimizer
    from dlrmtrain.validation import resolve_config, validate_config
    from dlrmtrain.workloads import build_datasets, build_sharded_model
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

    env = init_distributed("cpu")
    results = {}
    for arch in ("dlrm_v1", "dlrm_dcnv2"):
        for codec in ("none", "dedup"):
            for sparse_first in (True, False):
                cfg = resolve_config(tiny_config(out_dir, MIXED, f"model.arch={arch}",
                                                 f"comm.codec={codec}", "comm.dedup_at=owner"))
                validate_config(cfg, world_size)
                data = build_datasets(cfg, rank, world_size)
                model, _, _ = build_sharded_model(cfg, data.table_rows, env.device, world_size)
                assert set_sparse_first(model, sparse_first) == 1
                optimizer = build_optimizer(model, cfg.optim)
                order: list[str] = []
                dlrm = next(m for m in model.modules() if hasattr(m, "sparse_first"))
                dlrm.dense_arch.register_forward_pre_hook(lambda *_: order.append("bottom mlp"))
                dlrm.inter_arch.register_forward_pre_hook(lambda *_: order.append("interaction"))
                dlrm.dense_arch.register_full_backward_hook(lambda *_: order.append("bottom mlp backward"))

                def launched(_dist, args):
                    order.append("all-to-all")
                    # the rows' gradient reaches the lookup once the gradient all-to-all is waited for
                    args[0].register_hook(lambda _grad: order.append("embedding grad"))
                ebc = next(m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection))
                kinds = set()
                for (kind, _), out_dist in zip(pooled.shardings(ebc), sharded.output_dists(ebc)):
                    kinds.add(kind)
                    out_dist.register_forward_pre_hook(launched)
                losses = []
                for step, batch in enumerate(data.train_batches(0, 0)):
                    if step == STEPS:
                        break
                    optimizer.zero_grad()
                    loss, _ = model(batch.to(env.device))
                    loss.backward()
                    optimizer.step()
                    losses.append(loss.detach().clone())
                    if step == 0:
                        first_step = list(order)
                results[(arch, codec, sparse_first)] = {
                    "losses": torch.stack(losses), "order": first_step, "kinds": kinds}
                del model, optimizer
    torch.distributed.barrier()
    return results


@pytest.mark.timeout(400)
def test_sparse_first_overlaps_and_trains_bitwise_like_torchrecs_order(tmp_path):
    for rank, res in enumerate(run_ranks(_train_both_orders, 2, str(tmp_path), timeout=380)):
        for arch in ("dlrm_v1", "dlrm_dcnv2"):
            for codec in ("none", "dedup"):
                first, old = res[(arch, codec, True)], res[(arch, codec, False)]
                where = f"rank {rank} {arch} {codec}"
                assert first["kinds"] == {"table_wise", "row_wise"}, where
                # forward: both all-to-alls launched before the bottom MLP, rows waited for at the
                # interaction; backward: the gradients' all-to-alls waited for after the bottom MLP's
                assert first["order"] == ["all-to-all", "all-to-all", "bottom mlp", "interaction",
                                          "bottom mlp backward", "embedding grad", "embedding grad"], where
                assert old["order"] == ["bottom mlp", "all-to-all", "all-to-all", "interaction",
                                        "embedding grad", "embedding grad", "bottom mlp backward"], where
                assert first["losses"].equal(old["losses"]), f"{where}: {first['losses']} != {old['losses']}"
                assert not first["losses"][0].equal(first["losses"][-1]), f"{where}: did not train"
