"""The services layer over real Monarch actors: which replica serves a call, how a batch is split and
put back in order, and collectives that answer with rank 0's value."""
from __future__ import annotations

import os

import pytest
from monarch.actor import this_host

from rlexp.core.services import Collective, Service, shard_bounds
from tests.conftest import REPO
from tests.service_actors import Echo


@pytest.fixture(scope="module")
def replicas():
    # The actor class lives in tests/: the spawned processes import it from the repository root.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    meshes = [this_host().spawn_procs(per_host={"procs": 1}) for _ in range(2)]
    ranks = this_host().spawn_procs(per_host={"procs": 2})
    yield [m.spawn("echo", Echo, i) for i, m in enumerate(meshes)], ranks.spawn("ranked", Echo, 9)
    for m in [*meshes, ranks]:
        m.stop().get(timeout=30)


def test_shard_bounds_keep_whole_units_and_cover_everything() -> None:
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(12, 2, unit=4) == [(0, 4), (4, 12)]  # 3 groups of 4: one replica takes two
    assert shard_bounds(8, 4, unit=4) == [(0, 4), (4, 8)]  # fewer groups than replicas: no empty calls
    assert shard_bounds(0, 2) == []


def test_route_fanout_scatter(replicas) -> None:
    handles, _ = replicas
    svc = Service("echo", handles)
    assert [svc.who.route().get() for _ in range(4)] == [0, 1, 0, 1]  # round robin
    assert svc.who.fanout().get() == [0, 1]
    parts = svc.tag.scatter([1, 2, 3, 4, 5, 6], 10, unit=2, rows=[list("abcdef")],
                            per_shard=lambda i: (100 + i,)).get()
    assert parts == [[(10, "a", 100, 0, 2), (20, "b", 100, 0, 2)],
                     [(30, "c", 101, 1, 4), (40, "d", 101, 1, 4), (50, "e", 101, 1, 4), (60, "f", 101, 1, 4)]]
    # `then` transforms without blocking; nothing was collected before `get`.
    assert svc.who.fanout().then(sum).get() == 1


def test_collective_calls_every_rank_and_keeps_rank_0(replicas) -> None:
    _, ranked = replicas
    assert Collective("ranked", ranked).rank.call() == 0
    assert sorted(ranked.rank.call().get().values()) == [0, 1]
