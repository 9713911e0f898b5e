"""Two-level dedup (`comm.hierarchy: node`) against TorchRec's stock all-to-all, and its pieces.

One 4-rank run (2 simulated nodes x 2 ranks, set by comm.ranks_per_node on
plain loopback) checks everything that needs ranks: the forward bitwise equal
to `none` (table-, column- and row-wise, one-hot, multi-hot, jagged, empty
bags, a per-table `none` inside the all-to-all), gradients and losses within dedup's bounds
(test_dedup_training.py), and the traffic counted from the ids: between nodes
exactly the node-level distinct rows of each (table, destination node) - so no
rank re-sends a row a rank of its node sent - and each rank talking between
nodes only to its rail peer. The node-level unique and the subset each rank
receives are checked against brute force without ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from dlrmtrain.comm.dedup.kernels import block_unique
from dlrmtrain.comm.dedup.two_level.shared import BagBlock, blocks_unique, node_subsets
from dlrmtrain.comm.layout import FeatureEntry
from dlrmtrain.comm.stats import HOPS, DistCommStats
from dlrmtrain.comm.topology import Hierarchy, NodeTopology
from dlrmtrain.config.loader import ConfigError, load_config
from dlrmtrain.validation import validate_config
from tests.comm.cuda_futures import cuda_like_futures
from tests.comm.ranks import Scenario, Table, bags_for, count_host_syncs, run_codec, to_numpy
from tests.comm.test_dedup_training import GRAD_ATOL, GRAD_RTOL, LOSS_RTOL
from tests.multiproc import run_ranks

WORLD, PER_NODE = 4, 2
REPO = Path(__file__).resolve().parents[2]
NODE = Hierarchy("node", PER_NODE)
SC = Scenario(tables=(
    Table("a", 20, 8, ("tw", 0)),
    Table("b", 20, 4, ("tw", 3), bag=3),            # DCNv2-style multi-hot: bag = lookup[id]
    Table("c", 20, 8, ("cw", (1, 2))),               # column shards on both nodes
    Table("d", 20, 4, ("tw", 1), ids="jagged"),      # bags of 0-3 ids
    Table("e", 20, 4, ("tw", 2)),                    # codec none inside the dedup all-to-all
    Table("r", 8, 8, ("rw",), ids="missing"),        # row-wise (blocks of 2 rows), empty bags
), batch=8, steps=3, table_codecs={"e": "none"})
# row-wise bags of several ids may span shards: every step falls back to TorchRec's reduce-scatter
MULTI_ID_ROW_WISE = Scenario(tables=(Table("j", 8, 8, ("rw",), ids="jagged"), Table("a", 20, 8, ("tw", 1))),
                             batch=4, steps=2)


# ----------------------------------------------------------------- no ranks
def _as_kjt_arrays(bags: list[list[int]]):
    lengths = torch.tensor([len(b) for b in bags], dtype=torch.int64)
    values = torch.tensor([i for b in bags for i in b], dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    return values, offsets, lengths


@pytest.mark.parametrize("kind", ["one_hot", "jagged"])
def test_node_unique_equals_brute_force_and_each_rank_gets_its_own_unique_order(kind):
    g = torch.Generator().manual_seed(3)
    sizes = [7, 5, 9]  # three ranks of one node, uneven batches
    if kind == "one_hot":
        per_rank = [[[int(i)] for i in torch.randint(0, 6, (n,), generator=g)] for n in sizes]
    else:
        per_rank = [[torch.randint(0, 3, (int(k),), generator=g).tolist()
                     for k in torch.randint(0, 4, (n,), generator=g)] for n in sizes]
    node_bags = [b for bags in per_rank for b in bags]
    values, offsets, lengths = _as_kjt_arrays(node_bags)
    width = max(1, max(len(b) for b in node_bags))
    entry = FeatureEntry("f", "t", 4, 10)
    u, = blocks_unique(values, offsets, lengths, [BagBlock(0, len(node_bags), width, entry, True)])
    distinct = sorted({tuple(b) for b in node_bags})  # tuples sort like the -1-padded keys
    assert int(u.count) == len(distinct)
    for b, bag in enumerate(node_bags):
        assert distinct[int(u.inverse[b])] == tuple(bag)
        assert tuple(node_bags[int(u.first[u.inverse[b]])]) == tuple(bag)  # a first occurrence
        assert int(u.first[u.inverse[b]]) <= b
    chosen, counts = node_subsets([u.inverse], sizes, len(node_bags))
    for k, bags in enumerate(per_rank):
        count = int(counts[k, 0])
        # what the forwarder sends this rank: its distinct bags, in the order the rank's own unique gives
        v, o, n = _as_kjt_arrays(bags)
        mine = block_unique(v, o[:-1], n, width, 10)
        assert count == int(mine.count) == len({tuple(b) for b in bags})
        got = [distinct[int(i)] for i in chosen[k, 0, :count]]
        assert got == sorted({tuple(b) for b in bags})
        for b, bag in enumerate(bags):
            assert got[int(mine.inverse[b])] == tuple(bag)


def test_blocks_unique_gathers_scattered_blocks_and_matches_one_block_at_a_time():
    # an owner's blocks on node 0 of 2 x 2 ranks, two tables: its ranks' blocks, then node 1's node
    # block (one-hot, some bags empty) - the one-hot blocks of each size go through one sort
    g = torch.Generator().manual_seed(5)
    B, GB = 6, 24
    lengths = torch.randint(0, 2, (2 * GB,), generator=g)
    values = torch.randint(0, 7, (int(lengths.sum()),), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    entry = FeatureEntry("f", "t", 4, 7)
    specs = [BagBlock(i * GB + a, n, 1, entry, True) for i in range(2) for a, n in ((0, B), (B, B), (2 * B, 2 * B))]
    for s, u in zip(specs, blocks_unique(values, offsets, lengths, specs)):
        one = block_unique(values, offsets[s.start:s.start + s.size], lengths[s.start:s.start + s.size], 1, 7)
        n = int(one.count)
        assert int(u.count) == n and torch.equal(u.inverse, one.inverse) and torch.equal(u.first[:n], one.first[:n])


def test_traffic_counts_messages_and_bytes_between_and_inside_nodes():
    stats = DistCommStats(codec="dedup", sharding_type="table_wise")
    topo = NodeTopology(world_size=4, ranks_per_node=2, rank=1)
    # (peer, elements sent forward, elements received forward); backward sends what forward received
    stats.count_traffic([(0, 8, 0), (1, 5, 5), (2, 4, 2), (3, 0, 0)], 1, topo.node_of, 4)
    assert stats.messages == 3            # to 0 forward, to 2 forward and back; never to itself
    assert stats.inter_node_messages == 2
    assert stats.inter_node_bytes == (4 + 2) * 4
    assert stats.intra_node_bytes == 8 * 4


def test_topology_groups_ranks_into_nodes_and_rails():
    topo = NodeTopology(world_size=8, ranks_per_node=4, rank=6)
    assert (topo.nodes, topo.node, topo.local_rank) == (2, 1, 2)
    assert topo.node_ranks(1) == [4, 5, 6, 7]
    assert topo.rail_ranks(2) == [2, 6]


@pytest.mark.parametrize("overrides, key", [
    (["comm.codec=fp16"], "comm.codec"),
    (["comm.codec=dedup+fp16"], "comm.codec"),
    (["comm.codec=dedup", "comm.ranks_per_node=3"], "comm.ranks_per_node"),
    (["comm.codec=dedup", "comm.table_codecs={t_cat_4: fp16}"], "comm.table_codecs.t_cat_4"),
])
def test_config_refuses_what_two_level_cannot_carry(overrides, key):
    cfg = load_config(None, ["comm.hierarchy=node", "comm.ranks_per_node=2", *overrides])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(cfg, world_size=4)



def test_config_refuses_two_levels_for_sequence_embeddings():
    cfg = load_config(REPO / "configs" / "mini_dlrmv4.yaml", ["comm.codec=dedup", "comm.hierarchy=node",
                                                              "comm.ranks_per_node=1"])
    with pytest.raises(ConfigError, match=r"comm\.hierarchy.*sequence embeddings"):
        validate_config(cfg, world_size=2)


# ------------------------------------------------------------------ 4 ranks
@contextlib.contextmanager
def _recorded_new_groups():
    """Every `dist.new_group` call: (its ranks, its device_id, made by install's one setup call)."""
    import inspect

    import torch.distributed as dist

    calls, real = [], dist.new_group

    def recording(ranks=None, *args, **kwargs):
        at_setup = any(f.function == "_with_node_groups" for f in inspect.stack())
        calls.append((list(ranks), kwargs.get("device_id"), at_setup))
        return real(ranks, *args, **kwargs)

    dist.new_group = recording
    try:
        yield calls
    finally:
        dist.new_group = real


def _compare(rank: int, world_size: int, sc: Scenario, fallback: Scenario) -> dict:
    out, made = {}, []
    bf16 = dataclasses.replace(sc, precision="bf16")  # bf16 rows on the wire (precision.py)
    with _recorded_new_groups() as groups:
        with cuda_like_futures() as checked:  # every callback's value extracted as a CUDA future does
            out["node"] = run_codec(sc, "dedup", rank, world_size, hierarchy=NODE)
        made.append(len(groups))
        for name, run in (("none", lambda: run_codec(sc, "none", rank, world_size)),
                          ("fallback_none", lambda: run_codec(fallback, "none", rank, world_size)),
                          ("fallback_node", lambda: run_codec(fallback, "dedup", rank, world_size, hierarchy=NODE)),
                          ("syncs", lambda: count_host_syncs(rank, world_size, sc, "dedup", NODE)),
                          ("auto", lambda: run_codec(sc, "auto", rank, world_size, hierarchy=NODE)),
                          ("bf16_none", lambda: run_codec(bf16, "none", rank, world_size)),
                          ("bf16_node", lambda: run_codec(bf16, "dedup", rank, world_size, hierarchy=NODE))):
            out[name] = run()
            made.append(len(groups) - sum(made))
    return to_numpy({**out, "callbacks_checked": len(checked), "new_groups": groups, "groups_per_run": made})


def _owner_shards(t: Table) -> list[int]:
    if t.placement[0] == "rw":
        return list(range(WORLD))
    return [t.placement[1]] if t.placement[0] == "tw" else list(t.placement[1])


def _distinct_rows(t: Table, bags: list[tuple], shard: int | None = None) -> int:
    """Rows the two-level codec moves for these bags (to one shard's rows, row-wise)."""
    if t.placement[0] == "rw":  # one-hot ids; an empty bag reads a zero row, nothing is sent
        block = -(-t.rows // WORLD)
        return len({b[0] for b in bags if b and (shard is None or b[0] // block == shard)})
    return len(bags) if SC.table_codecs.get(t.name) == "none" else len(set(bags))


def _expected_rows(sc: Scenario):
    """Counted from the ids: rows between nodes, and rows the owners send (node-level distinct rows
    to other nodes; to their own node's ranks each rank's distinct rows, row-wise the node's), per table."""
    topo = NodeTopology(WORLD, PER_NODE, 0)
    between = 0  # elements (forward), all tables and owners
    rail_sent = {t.name: 0 for t in sc.tables}
    for step in range(sc.steps):
        bags = [bags_for(sc, step, r) for r in range(WORLD)]
        for t in sc.tables:
            owners = _owner_shards(t)
            shard_dim = t.dim if t.placement[0] == "rw" else t.dim // len(owners)
            for n in range(topo.nodes):
                node_bags = [tuple(b) for r in topo.node_ranks(n) for b in bags[r][f"f_{t.name}"]]
                for o in owners:
                    rows = _distinct_rows(t, node_bags, o if t.placement[0] == "rw" else None)
                    if topo.node_of(o) == n and t.placement[0] != "rw":
                        # its own node's ranks get their own distinct rows straight from the owner
                        rows = sum(_distinct_rows(t, [tuple(b) for b in bags[r][f"f_{t.name}"]])
                                   for r in topo.node_ranks(n))
                    rail_sent[t.name] += rows * shard_dim * 4
                    if topo.node_of(o) != n:
                        between += rows * shard_dim
    return between, rail_sent


def _in_callback(sync: tuple[str, str]) -> bool:
    """A sync in `start_node_ids` (row-wise on this thread, else maybe in a callback)."""
    import inspect

    from dlrmtrain.comm.dedup.two_level import node_ids

    lines, first = inspect.getsourcelines(node_ids.start_node_ids)
    file, line = sync[1].rsplit(":", 1)
    return file == "comm/dedup/two_level/node_ids.py" and first <= int(line) < first + len(lines)


@pytest.mark.timeout(300)
def test_two_nodes_of_two_ranks_match_none_and_send_node_unique_rows_once():
    results = run_ranks(_compare, WORLD, SC, MULTI_ID_ROW_WISE, timeout=280)
    for rank, res in enumerate(results):
        none, node = res["none"], res["node"]
        assert np.array_equal(none["pooled"], node["pooled"]), f"rank {rank}: forward differs"
        assert np.array_equal(node["split_path_pooled"], none["pooled"])
        for name, g in none["dense_grads"].items():
            assert np.array_equal(g, node["dense_grads"][name]), f"rank {rank}: {name} grad differs"
        assert len(none["emb_grads"]) == len(node["emb_grads"]) > 0
        for per_n, per_d in zip(none["emb_grads"], node["emb_grads"]):
            for gn, gd in zip(per_n, per_d):
                np.testing.assert_allclose(gd, gn, rtol=GRAD_RTOL, atol=GRAD_ATOL)
        np.testing.assert_allclose(node["losses"], none["losses"], rtol=LOSS_RTOL)
        # the two-level callbacks (the id exchange's launch, the backward rail hop's) return what a
        # CUDA future can extract (tensors or None): on NCCL a Work in their value makes wait() raise
        assert res["callbacks_checked"] > 0
        stats = node["stats"]
        assert stats["hierarchy"] == ["node"]
        assert "messages/step" in node["summary"] and "between nodes" in node["summary"]  # console
        # per-hop times, in comm_stats.json and on the console
        assert {"ids", "plan", "gather", "expand", "scatter"} <= set(stats["hop_ms_per_step"]) <= set(HOPS)
        assert "ms/step per hop: ids" in node["summary"]
        assert stats["fallback_steps"] == 0  # one-hot row-wise steps never need the reduce-scatter
        # between nodes a rank talks only to its rail peer: per all-to-all, rows forward if it owns
        # a table there, gradients back if the peer does
        peer = (rank + PER_NODE) % WORLD
        owners = [{o for t in SC.tables if t.placement[0] == kind for o in _owner_shards(t)} for kind in ("tw", "cw")]
        table_wise = sum((rank in o) + (peer in o) for o in owners)
        counts = len(owners)  # each table-/column-wise dist tells its rail peer its row counts: one message
        assert table_wise + counts <= stats["inter_node_messages_per_step"] <= table_wise + counts + 2  # + row-wise
        # rows reaching each rank: its own distinct bags per table (one-level dedup's receive side)
        for t in SC.tables:
            got = stats["tables"][t.name]
            own = [bags_for(SC, s, rank)[f"f_{t.name}"] for s in range(SC.steps)]
            rows = sum(_distinct_rows(t, [tuple(x) for x in b]) for b in own)
            assert got["payload_fwd_recv_bytes"] == rows * t.dim * 4, (rank, t.name)
        # GPU readiness, counted on CPU: two host syncs per dist per step (every block's unique count with
        # the rail peers' counts; the id exchange's counts), nothing else; the transfers are in flight on
        # return. The table- and column-wise dists read the id exchange's counts in a callback when their
        # all-gather is in (`start_node_ids`): on this thread only if it was in already, else on Gloo's,
        # where this counter does not see it
        syncs = res["syncs"]
        assert syncs["dists"] == 3 and syncs["awaitables"] == ["TwoLevelAwaitable"] * 3
        # stream-safe: a plan's record_stream reaches every tensor it holds, those of its deferred
        # stage 2 (a closure over the step's ids, uniques and counts) too; the awaited output recorded
        assert all(found > 0 and missed == 0 for found, missed in syncs["plans_unrecorded"]), syncs
        assert syncs["ctx_unrecorded"][1] == 0 and syncs["awaited_recorded"] == [True] * 3
        assert all(found > 0 and missed == 0 for found, missed in syncs["request_unrecorded"])
        first, *rest = syncs["per_step"]
        assert {name for name, _ in first} == {"tolist"}
        # key widths are learned: the first step's multi-hot and jagged bags outgrow them once (two
        # more syncs per such dist: their longest bags, the counts again)
        assert len([s for s in first if not _in_callback(s)]) in (3, 5, 7), (rank, first)
        for step in rest:
            assert {name for name, _ in step} == {"tolist"}, (rank, step)
            assert len([s for s in step if not _in_callback(s)]) == 3, (rank, step)  # 2 plans, row-wise's 1
            assert 1 <= len([s for s in step if _in_callback(s)]) <= 3, (rank, step)  # + row-wise's exchange
        # auto under node: none or the two-level dedup, both lossless (it probes both in these steps)
        assert np.array_equal(res["auto"]["pooled"], none["pooled"])
        np.testing.assert_allclose(res["auto"]["losses"], none["losses"], rtol=LOSS_RTOL)
        assert res["auto"]["stats"]["hierarchy"] == ["node"]
        assert res["auto"]["stats"]["inter_node_messages_per_step"] > 0  # its dedup steps went two-level
        # multi-id row-wise bags: the reduce-scatter on every rank, every step; still equal to none
        assert np.array_equal(res["fallback_none"]["pooled"], res["fallback_node"]["pooled"])
        np.testing.assert_allclose(res["fallback_node"]["losses"], res["fallback_none"]["losses"], rtol=LOSS_RTOL)
        assert res["fallback_node"]["stats"]["fallback_steps"] == MULTI_ID_ROW_WISE.steps
        # under bf16: the forward bitwise none's, half the rows' bytes, each level's sums in fp32
        # rounded once to bf16 (losses within bf16's rounding of none's)
        bf16_none, bf16_node = res["bf16_none"], res["bf16_node"]
        assert bf16_node["pooled_dtype"] == "torch.bfloat16"
        assert np.array_equal(bf16_none["pooled"], bf16_node["pooled"]), f"rank {rank}: bf16 forward differs"
        np.testing.assert_allclose(bf16_node["losses"], bf16_none["losses"], rtol=2.0 ** -7)
        for t in SC.tables:
            fp32_bytes = node["stats"]["tables"][t.name]["payload_fwd_recv_bytes"]
            assert bf16_node["stats"]["tables"][t.name]["payload_fwd_recv_bytes"] * 2 == fp32_bytes, t.name
        assert bf16_node["stats"]["inter_node_bytes_per_step"] * 2 == pytest.approx(
            stats["inter_node_bytes_per_step"], rel=0.2)  # the rows halve; counts and ids do not
    # process groups: made at setup only (install's one call, before any dist), on every rank the
    # same calls in the same order; the intra-node and rail families once per process, then each
    # two-level dist's own callback groups: a rail (the backward rail hop), table-/column-wise
    # also a node (the id exchange); no device_id on CPU (torch refuses one), the GPU's on CUDA
    groups = results[0]["new_groups"]
    assert all(res["new_groups"] == groups for res in results)
    assert all(at_setup and device is None for _, device, at_setup in groups)
    nodes, rails = [[0, 1], [2, 3]], [[0, 2], [1, 3]]
    assert [g for g, _, _ in groups[:4]] == nodes + rails
    own = [g for g, _, _ in groups[4:]]
    assert [own[k:k + 2] for k in range(0, len(own), 2)].count(nodes) == 2 + 1 + 2 + 2 + 2  # tw, cw per SC run
    # SC's run: families + tw and cw (rail + node each) + rw (rail); none: none; the fallback: rw + tw;
    # syncs, auto and bf16's two-level run as SC's
    assert results[0]["groups_per_run"] == [4 + 4 + 4 + 2, 0, 0, 2 + 4, 4 + 4 + 2, 4 + 4 + 2, 0, 4 + 4 + 2]
    between, rail_sent = _expected_rows(SC)
    everyone = results[0]["node"]["stats_all_ranks"]
    # between nodes: exactly the node-level distinct rows, forward and backward - none twice
    assert everyone["inter_node_bytes_per_step"] * SC.steps == 2 * between * 4
    for t in SC.tables:
        assert everyone["tables"][t.name]["payload_fwd_sent_bytes"] == rail_sent[t.name], t.name
    assert everyone["id_exchange_bytes_per_step"] > 0
