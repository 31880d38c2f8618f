"""Services keep serving when a replica's process is killed: the request is re-issued (same arguments, same
seed, same answer) to a respawned replica that first receives the sticky state, or to a healthy one when
the dead replica is retired; accounting stays exact. Real Monarch processes, really killed (SIGKILL)."""
from __future__ import annotations

import contextlib
import os
import signal

import monarch.actor
import pytest
from monarch.actor import this_host

from rlexp.core.services import Service, ServiceDown
from tests.conftest import REPO
from tests.service_actors import Tally, Versioned

pytestmark = pytest.mark.slow  # each kill waits for Monarch's supervision poll (1 s: conftest.py)


@pytest.fixture
def spawned():
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    hook = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = lambda failure: None  # as rlexp.run.launcher does: callers see the error
    meshes = []

    def spawn(i: int, actor: type = Versioned):
        m = this_host().spawn_procs(per_host={"procs": 1})
        meshes.append(m)
        return m.spawn(actor.__name__.lower(), actor, i)

    yield spawn
    for m in meshes:
        with contextlib.suppress(Exception):  # the killed ones
            m.stop().get(timeout=30)
    monarch.actor.unhandled_fault_hook = hook


def kill(handle) -> None:
    os.kill(handle.pid.call_one().get(), signal.SIGKILL)


def test_killed_replica_is_respawned_given_sticky_state_and_its_work_reissued(spawned) -> None:
    respawns = []

    def recover(i, error):
        respawns.append((i, type(error).__name__))
        return spawned(10 + i)

    svc = Service("versioned", [spawned(0), spawned(1)], recover=recover, sticky=("set_version",))
    svc.set_version.fanout(7).get()
    expected = [[(x * (100 + i), 7) for x in part] for i, part in enumerate([[1, 2], [3, 4]])]
    assert svc.work.scatter([1, 2, 3, 4], per_shard=lambda i: (100 + i,)).get() == expected
    kill(svc.replicas[1])
    assert svc.work.scatter([1, 2, 3, 4], per_shard=lambda i: (100 + i,)).get() == expected  # same answer
    assert respawns == [(1, "SupervisionError")]
    assert svc.who.fanout().get() == [(0, 7), (11, 7)]  # the replacement got version 7 before serving
    s = svc.stats
    assert (s.failures, s.respawned, s.retired, s.retried) == (1, 1, 0, 1)
    assert s.issued == s.completed  # nothing lost, nothing counted twice
    assert svc.metrics()["service/versioned/replicas"] == 2.0


def test_a_replacement_starts_from_its_dead_predecessors_state(spawned) -> None:
    """A stateful replica (Weaver's reward: a pool, a fit, labels already read) killed between steps: its
    replacement is written the state the dead one had after its last completed call, so the next answers are the
    uninterrupted run's; without `state` it would start from nothing (totals restart at 0)."""
    svc = Service("tally", [spawned(0, Tally), spawned(1, Tally)], recover=lambda i, e: spawned(10 + i, Tally),
                  state=("state_dict", "load_state_dict"))
    assert svc.add.scatter([1, 2, 3, 4]).get() == [[1, 3], [3, 7]]
    kill(svc.replicas[1])
    assert svc.add.scatter([1, 2, 3, 4]).get() == [[4, 6], [10, 14]]  # replica 1 went on from 7, not from 0
    assert svc.state_dict.fanout().get() == [{"total": 6, "seen": 4}, {"total": 14, "seen": 4}]
    assert (svc.stats.respawned, svc.stats.retried) == (1, 1)
    svc.restore("load_state_dict", [{"total": 100, "seen": 9}, {"total": 200, "seen": 9}])  # a resumed checkpoint
    kill(svc.replicas[0])
    assert svc.add.scatter([1, 2, 3, 4]).get() == [[101, 103], [203, 207]]


def test_replica_without_respawn_is_retired_and_the_rest_carry_its_shard(spawned) -> None:
    svc = Service("versioned", [spawned(0), spawned(1)])
    svc.set_version.fanout(3).get()
    kill(svc.replicas[0])
    out = svc.work.scatter([1, 2, 3, 4], per_shard=lambda i: (10 + i,)).get()
    assert out == [[(10, 3), (20, 3)], [(33, 3), (44, 3)]]  # both shards, both with their own seed
    assert svc.healthy() == [1] and svc.stats.retired == 1
    assert "retired" in svc.events[0] and "Killed" in svc.events[0]
    assert [svc.who.route().get() for _ in range(3)] == [(1, 3)] * 3
    assert svc.set_version.fanout(4).get() == [None]  # fanout skips the retired replica
    kill(svc.replicas[1])
    with pytest.raises(ServiceDown, match="every replica has failed"):
        svc.who.route().get()


def test_whoever_holds_replicas_handles_is_told_of_each_change(spawned) -> None:
    """`changed` runs after a replacement, a retirement and an addition (the launcher then gives
    each reward replica's policy judges the live generators), and `in_turn(shard)` lists the live
    replicas' handles, the one serving that slice first: never a dead one."""
    def live(shard: int) -> list[int]:
        return [h.who.call_one().get()[0] for h in svc.in_turn(shard)]

    told: list[list[int]] = []
    svc = Service("versioned", [spawned(0), spawned(1), spawned(2)],
                  recover=lambda i, e: spawned(10 + i), max_restarts=1,
                  changed=lambda: told.append(live(1)))
    assert live(1) == [1, 2, 0] and live(0) == [0, 1, 2] and told == []
    kill(svc.replicas[1])
    svc.who.fanout().get()
    assert told == [[11, 2, 0]]  # told once the replacement serves, which comes first for slice 1
    kill(svc.replicas[1])
    svc.who.fanout().get()  # a second death: past max_restarts, retired
    assert told[1:] == [[2, 0]] and not svc.alive[1]
    svc.add_replica(spawned(3))
    assert told[2:] == [[2, 3, 0]] and live(3) == [3, 0, 2]
