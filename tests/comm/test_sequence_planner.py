"""The sequence planner's plans carried out in one process: every rank's plan, for the ids
each rank would hold after TorchRec's id all-to-all, moved between the ranks by hand.

Each owner "looks up" a row that names its (table, global id); the rows cross as
the plans' splits say; each sample rank expands what it received. The result
must be, per sample value, the row of its own (table, id): what `none` delivers.
No process group is needed: the planner is pure tensor code, and this checks it
on layouts the spawned tests (test_sequence_dedup.py) do not reach: unequal
row-wise blocks, three ranks, uneven batches, features sharing a table.
"""

from __future__ import annotations

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrmtrain.comm.dedup.kernels import segment_sum_rows
from dlrmtrain.comm.dedup.plan import DedupStep
from dlrmtrain.comm.layout import SequenceLayout
from dlrmtrain.comm.dedup.sequence import SequencePlanner
from dlrmtrain.comm.stats import DistCommStats

TABLES = {"items": 23, "users": 9}
FEATURES = [("item_id", "items"), ("user_id", "users"), ("candidate", "items")]  # two share "items"
CPU = torch.device("cpu")


def _batches(world: int, sizes: list[int], seed: int) -> list[list[list[list[int]]]]:
    """Per sample rank, per feature, per sample: its ids (short sequences with repeats, some empty)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(world):
        per_feature = []
        for _, table in FEATURES:
            rows = TABLES[table]
            per_feature.append([torch.randint(0, rows, (int(torch.randint(0, 5, (1,), generator=g)),),
                                              generator=g).tolist() for _ in range(sizes[r])])
        out.append(per_feature)
    return out


def _kjt(per_feature_bags: list[list[list[int]]]) -> KeyedJaggedTensor:
    lengths = [len(bag) for bags in per_feature_bags for bag in bags]
    values = [i for bags in per_feature_bags for bag in bags for i in bag]
    return KeyedJaggedTensor(keys=[f for f, _ in FEATURES], values=torch.tensor(values, dtype=torch.int64),
                             lengths=torch.tensor(lengths, dtype=torch.int64))


def _owner_of(table: str, i: int, world: int, row_wise: bool) -> tuple[int, int]:
    """(owner rank, id within the owner's rows): row-wise blocks of ceil(rows / world); table-wise
    "items" on rank 0 and "users" on the last rank."""
    if row_wise:
        block = -(-TABLES[table] // world)
        return i // block, i - (i // block) * block
    return (0 if table == "items" else world - 1), i


def _layouts(world: int, row_wise: bool) -> list[SequenceLayout]:
    tables = sorted(TABLES)
    t_of = {f: tables.index(t) for f, t in FEATURES}
    out = []
    for rank in range(world):
        if row_wise:
            blocks = [-(-TABLES[t] // world) for _, t in FEATURES]
            own = list(range(len(FEATURES)))
            owner_rows = [max(0, min(b, TABLES[t] - rank * b)) for b, (_, t) in zip(blocks, FEATURES)]
            owners = None
        else:
            blocks = None
            owners = [_owner_of(t, 0, world, False)[0] for _, t in FEATURES]
            own = [k for k, o in enumerate(owners) if o == rank]
            owner_rows = [TABLES[FEATURES[k][1]] for k in own]
        out.append(SequenceLayout(world, dim=2, tables=tables, owner_tables=[t_of[FEATURES[k][0]] for k in own],
                                  owner_rows=owner_rows, sample_tables=[t_of[f] for f, _ in FEATURES],
                                  sample_owner=owners, sample_block=blocks,
                                  sample_rows=[TABLES[t] for _, t in FEATURES], features=[f for f, _ in FEATURES]))
    return out


def _owner_kjts(batches, world: int, row_wise: bool, layouts) -> list[tuple[KeyedJaggedTensor, list]]:
    """What each owner receives (feature, sample rank, sample order; ids within its rows), and the
    (table, global id) of each of its values: what its lookup returns."""
    out = []
    for rank in range(world):
        own = [k for k, (_, t) in enumerate(FEATURES)
               if row_wise or _owner_of(t, 0, world, False)[0] == rank]
        lengths, values, names = [], [], []
        for k in own:
            table = FEATURES[k][1]
            for r in range(world):
                for bag in batches[r][k]:
                    mine = [(i, _owner_of(table, i, world, row_wise)[1]) for i in bag
                            if _owner_of(table, i, world, row_wise)[0] == rank]
                    lengths.append(len(mine))
                    values += [local for _, local in mine]
                    names += [(table, i) for i, _ in mine]
        kjt = KeyedJaggedTensor(keys=[FEATURES[k][0] for k in own], values=torch.tensor(values, dtype=torch.int64),
                                lengths=torch.tensor(lengths, dtype=torch.int64))
        out.append((kjt, names))
    return out


def _code(table: str, i: int) -> list[float]:
    return [float(sorted(TABLES).index(table)), float(i)]


@pytest.mark.parametrize("world,row_wise,sizes", [(2, True, [4, 4]), (3, True, [3, 5, 2]), (3, False, [4, 1, 3]),
                                                  (2, False, [2, 0])])
def test_plans_deliver_every_rank_its_own_rows(world: int, row_wise: bool, sizes: list[int]) -> None:
    batches = _batches(world, sizes, seed=world * 10 + len(sizes) + int(row_wise))
    layouts = _layouts(world, row_wise)
    owners = _owner_kjts(batches, world, row_wise, layouts)
    plans = []
    for rank in range(world):
        step = DedupStep(owners[rank][0], _kjt(batches[rank]), sizes, rank, CPU, 4, 4,
                         DistCommStats(codec="dedup", sharding_type="row_wise" if row_wise else "table_wise"))
        plans.append(SequencePlanner(layouts[rank], rank).plan(step))
    for d in range(world):  # sample rank d receives from every owner, rank-major
        parts = []
        for r in range(world):
            lookup = torch.tensor([_code(*n) for n in owners[r][1]]).view(-1, 2)
            sent = lookup[plans[r].send_index].view(-1).split(plans[r].send_splits)
            assert sent[d].numel() == plans[d].recv_splits[r]  # both ends agree on the size
            parts.append(sent[d])
        recv = torch.cat(parts).view(-1, 2)
        got = recv[plans[d].recv_index]
        want = torch.tensor([_code(FEATURES[k][1], i) for k, bags in enumerate(batches[d]) for bag in bags
                             for i in bag]).view(-1, 2)
        assert torch.equal(got, want)
        # each distinct (table, id) crossed once per owner: the rows received are distinct
        assert len({tuple(row) for row in recv.tolist()}) == recv.shape[0]


def test_plan_keeps_its_sort_for_the_gradient_sums() -> None:
    """The backward's segments come from the plan's sort: equal to sorting `recv_index` again,
    and the sums bitwise those of the plain segment sum."""
    world, sizes = 2, [5, 3]
    batches = _batches(world, sizes, seed=7)
    layouts = _layouts(world, True)
    owners = _owner_kjts(batches, world, True, layouts)
    for rank in range(world):
        plan = SequencePlanner(layouts[rank], rank).plan(
            DedupStep(owners[rank][0], _kjt(batches[rank]), sizes, rank, CPU, 4, 4,
                      DistCommStats(codec="dedup", sharding_type="row_wise")))
        units = sum(plan.recv_splits) // plan.unit
        lengths = torch.bincount(plan.recv_index, minlength=units)
        assert torch.equal(plan.recv_segments.order, torch.sort(plan.recv_index, stable=True).indices)
        assert torch.equal(plan.recv_segments.offsets, torch.cumsum(lengths, 0) - lengths)
        grad = torch.randn(plan.recv_index.numel(), 3) * torch.logspace(-5, 5, plan.recv_index.numel()).unsqueeze(1)
        assert torch.equal(segment_sum_rows(grad, plan.recv_index, units, plan.recv_segments),
                           torch.zeros(units, 3).index_add_(0, plan.recv_index, grad))


def test_an_id_outside_its_table_is_refused() -> None:
    world, sizes = 2, [2, 2]
    batches = _batches(world, sizes, seed=3)
    batches[0][1][0] = [TABLES["users"]]  # one past the last row of "users"
    layouts = _layouts(world, True)
    sample = _kjt(batches[0])
    owner = _owner_kjts(_batches(world, sizes, seed=3), world, True, layouts)[0][0]
    step = DedupStep(owner, sample, sizes, 0, CPU, 4, 4, DistCommStats(codec="dedup", sharding_type="row_wise"))
    with pytest.raises(ValueError, match="ids outside their table"):
        SequencePlanner(layouts[0], 0).plan(step)


def test_cached_key_constants_are_recorded_on_the_stream_that_reads_them(monkeypatch) -> None:
    """The per-bag constants outlive a plan (cached per batch layout) and, under the pipeline, are
    read on the data-dist stream: every plan records them on the current stream, so a constant
    dropped from the cache waits for that stream's reads. CPU has no streams; a stand-in stream
    makes the records observable."""
    from dlrmtrain.comm import streams

    recorded = []
    stream = object()
    monkeypatch.setattr(streams, "current_stream", lambda device: stream)
    monkeypatch.setattr(streams, "record_tensor", lambda t, s: recorded.append((t, s)))
    world, sizes = 2, [3, 3]
    batches = _batches(world, sizes, seed=5)
    layouts = _layouts(world, True)
    owner = _owner_kjts(batches, world, True, layouts)[0][0]
    planner = SequencePlanner(layouts[0], 0)
    for _ in range(2):  # the second plan reads the cached constants again
        recorded.clear()
        planner.plan(DedupStep(owner, _kjt(batches[0]), sizes, 0, CPU, 4, 4,
                               DistCommStats(codec="dedup", sharding_type="row_wise")))
        constants = [*planner._bag_keys.values(), *planner._bounds.values()]
        assert len(constants) == 2
        assert all(any(t is c and s is stream for t, s in recorded) for c in constants)
