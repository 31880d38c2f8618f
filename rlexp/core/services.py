"""Services: the routing between the loop and the actors, so the loop holds only the algorithm.

A `Service` is the replicas of one actor (generator replicas, reward replicas, the replay buffer).
Its endpoints are reached as attributes, in the spirit of TorchForge's services:

    svc.generators.generate.route(prompts, n, ...)        # one replica (round robin)
    svc.generators.update_weights.fanout(version, where)   # every replica, same arguments
    svc.rewards.score.scatter(samples, texts, k, unit=k)   # one contiguous slice per replica

`Trainer`-like actors are different: one actor per rank, and every endpoint is a collective that all
ranks must enter. A `Collective` calls all of them and keeps rank 0's answer.

Calls return a `Pending`: nothing blocks until `.get()`, so a loop can keep requests in flight
(`sync=async`) and still read as a sequence of steps.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Generic, TypeVar

T = TypeVar("T")
U = TypeVar("U")


class Pending(Generic[T]):
    """Results not collected yet: Monarch futures plus how to combine what they return."""

    def __init__(self, futures: list[Any], combine: Callable[[list[Any]], T]) -> None:
        self._futures = futures
        self._combine = combine

    def get(self) -> T:
        return self._combine([f.get() for f in self._futures])

    def then(self, fn: Callable[[T], U]) -> Pending[U]:
        combine = self._combine
        return Pending(self._futures, lambda parts: fn(combine(parts)))


def shard_bounds(n_items: int, n_shards: int, unit: int = 1) -> list[tuple[int, int]]:
    """Contiguous [start, end) slices of whole `unit`s, as even as possible; empty slices are dropped."""
    n_units = n_items // unit
    edges = [(n_units * r // n_shards) * unit for r in range(n_shards + 1)]
    edges[-1] = n_items
    return [(a, b) for a, b in pairwise(edges) if b > a]


def is_process_failure(e: BaseException) -> bool:
    """Monarch's supervision error: the process behind the actor died (kill -9, OOM, segfault). Anything
    else an endpoint raises is the endpoint's own error and is not retried."""
    return any(t.__name__ == "SupervisionError" for t in type(e).__mro__)


class ServiceDown(RuntimeError):
    """Every replica of a service has failed and been retired: the run cannot go on."""


@dataclass
class ServiceStats:
    """Per-request accounting: every request issued is completed exactly once, first time or after being
    re-sent (`retried` counts the re-sends), so `issued - completed` is what was lost (0)."""

    issued: int = 0
    retried: int = 0
    completed: int = 0
    failures: int = 0
    respawned: int = 0
    retired: int = 0


# `recover(replica_index, error)` starts a replacement for a dead replica and returns its handle (None: retire it).
Recover = Callable[[int, BaseException], Any]


class _Call:
    """One request to one replica. A replica whose process died is recovered by its service and the request
    re-issued, to the replacement or to a healthy replica: the same arguments (its own seed included), so
    what comes back is what the dead replica would have returned."""

    def __init__(self, service: Service, endpoint: str, args: tuple[Any, ...], replica: int,
                 shard: int | None = None, to_every: bool = False) -> None:
        self.service, self.endpoint, self.args, self.shard, self.to_every = service, endpoint, args, shard, to_every
        self._send(replica)
        service.stats.issued += 1

    def _send(self, replica: int) -> None:
        self.replica, self.generation = replica, self.service.generation[replica]
        self.future = getattr(self.service.replicas[replica], self.endpoint).call_one(*self.args)

    def get(self) -> Any:
        svc = self.service
        while True:
            try:
                out = self.future.get()
                if svc.state is not None and not self.to_every:
                    svc.snapshots[self.replica] = getattr(svc.replicas[self.replica], svc.state[0]).call_one().get()
            except Exception as e:
                if not is_process_failure(e):
                    raise
                svc.replica_failed(self.replica, self.generation, e)
                if self.to_every and self.endpoint in svc.sticky:
                    svc.stats.completed += 1  # the replacement was given this call's state when it started
                    return None
                if self.to_every and not svc.alive[self.replica]:
                    svc.stats.completed += 1  # retired: nobody is left to receive it
                    return None
                svc.stats.retried += 1
                self._send(self.replica if self.to_every else svc.pick(self.shard))
                continue
            svc.stats.completed += 1
            return out


class _Endpoint:
    def __init__(self, service: Service, name: str) -> None:
        self.service, self.name = service, name

    def route(self, *args: Any) -> Pending[Any]:
        """Call one healthy replica, chosen round robin over the calls to this service."""
        return Pending([_Call(self.service, self.name, args, self.service.pick())], lambda parts: parts[0])

    def call(self, *args: Any) -> Any:
        """`route(...).get()`: the usual way to talk to a single-replica service such as the buffer."""
        return self.route(*args).get()

    def fanout(self, *args: Any) -> Pending[list[Any]]:
        """Call every healthy replica with the same arguments; results in replica order."""
        svc = self.service
        if self.name in svc.sticky:
            svc.sticky[self.name] = args
        return Pending([_Call(svc, self.name, args, r, to_every=True) for r in svc.healthy()], list)

    def scatter(self, items: Sequence[Any], *args: Any, unit: int = 1,
                per_shard: Callable[[int], tuple[Any, ...]] | None = None,
                rows: Sequence[Sequence[Any]] = ()) -> Pending[list[Any]]:
        """Split `items` (and the parallel sequences in `rows`) into the service's `shards` contiguous slices
        of whole `unit`s and call `endpoint(items_slice, *rows_slices, *args, *per_shard(i))` for slice i on
        a healthy replica (slice i on replica i while all are healthy). Returns the per-slice results in item
        order. `per_shard` gives arguments that belong to a slice, such as its sampling seed, so a slice's
        result depends neither on which replica serves it nor on how many replicas are alive."""
        svc = self.service
        calls = []
        for i, (a, b) in enumerate(shard_bounds(len(items), svc.shards, unit)):
            extra = per_shard(i) if per_shard is not None else ()
            call_args = (list(items[a:b]), *[list(r[a:b]) for r in rows], *args, *extra)
            calls.append(_Call(svc, self.name, call_args, svc.pick(i), shard=i))
        return Pending(calls, list)


class Service:
    """Replicas of one actor (each a Monarch actor mesh of one process), kept serving when processes die.

    `shards`: how many slices `scatter` cuts (default: one per replica). Fixed for the run, so the work each
    slice does, and its seed, do not change when a replica dies, is retired or is added.
    `recover`: starts a replacement process for a dead replica (the launcher's respawn); without it, or once a
    replica has failed `max_restarts` times, the replica is retired and the others carry its work.
    `sticky`: endpoints whose latest fanout is state a replica must hold before serving (the weights version);
    a replacement receives that call first.
    `state`: (read, write) endpoints of state each replica builds up by serving (a label model fit on the
    responses it scored, the dev labels it has read). After every routed call a replica completes its state is
    read; its replacement is written that state before the failed call is re-issued to it, so the call returns
    what the dead replica would have and nothing the dead one had spent (a label budget) is spent
    again. `changed`: called once a replica was replaced, retired or added, for whoever holds
    replicas' handles outside the service (a reward replica's policy judges ask generators)."""

    def __init__(self, name: str, replicas: list[Any], *, shards: int | None = None, recover: Recover | None = None,
                 max_restarts: int = 2, sticky: Sequence[str] = (), state: tuple[str, str] | None = None,
                 labels: Sequence[str] = (), log: Callable[[str], None] | None = None,
                 changed: Callable[[], None] | None = None) -> None:
        if not replicas:
            raise ValueError(f"service {name!r} has no replicas")
        self.name, self.replicas = name, list(replicas)
        self.shards = shards or len(replicas)
        self.alive = [True] * len(replicas)
        self.generation = [0] * len(replicas)  # bumped on every replacement: a late failure of the old one is old news
        self.failures = [0] * len(replicas)
        self.labels = list(labels) or [f"{name}[{i}]" for i in range(len(replicas))]
        self.recover, self.max_restarts = recover, max_restarts
        self.sticky: dict[str, tuple[Any, ...] | None] = dict.fromkeys(sticky)
        self.state = state
        self.snapshots: dict[int, Any] = {}  # replica -> its state after the last call it completed
        self.stats = ServiceStats()
        self.events: list[str] = []
        self.log = log or (lambda msg: None)
        self.changed = changed or (lambda: None)
        self._next = 0

    def healthy(self) -> list[int]:
        return [i for i, ok in enumerate(self.alive) if ok]

    def pick(self, shard: int | None = None) -> int:
        """Slice `shard` goes to replica `shard` while it is healthy, else to a healthy one (round robin)."""
        healthy = self.healthy()
        if not healthy:
            raise ServiceDown(f"{self.name}: every replica has failed and been retired ({'; '.join(self.events)})")
        if shard is not None:
            return shard if shard < len(self.alive) and self.alive[shard] else healthy[shard % len(healthy)]
        r = healthy[self._next % len(healthy)]
        self._next += 1
        return r

    def in_turn(self, shard: int) -> list[Any]:
        """The live replicas' handles, the one that serves slice `shard` now (`pick`) first."""
        first, healthy = self.pick(shard), self.healthy()
        at = healthy.index(first)
        return [self.replicas[i] for i in healthy[at:] + healthy[:at]]

    def replica_failed(self, i: int, generation: int, error: BaseException) -> None:
        """Replace or retire replica `i` after its process died (once per death, however many calls saw it)."""
        if generation != self.generation[i] or not self.alive[i]:
            return
        self.failures[i] += 1
        self.stats.failures += 1
        first_line = str(error).strip().splitlines()[-1][:200] if str(error).strip() else type(error).__name__
        if self.recover is None or self.failures[i] > self.max_restarts:
            why = "no respawn configured" if self.recover is None else f"failed {self.failures[i]} times"
            self.retire(i, f"{why} (last: {first_line})")
            return
        t = time.perf_counter()
        try:
            handle = self.recover(i, error)
        except Exception as e:  # a replacement that cannot start is a failure of its own
            self.retire(i, f"respawn failed: {e}")
            return
        if handle is None:
            self.retire(i, f"not respawned (last: {first_line})")
            return
        self.replicas[i] = handle
        self.generation[i] += 1
        if self.state is not None and i in self.snapshots:
            getattr(handle, self.state[1]).call_one(self.snapshots[i]).get()
        for endpoint, args in self.sticky.items():
            if args is not None:
                getattr(handle, endpoint).call_one(*args).get()
        self.stats.respawned += 1
        self._event(f"{self.labels[i]} died ({first_line}); respawned in {time.perf_counter() - t:.1f}s")
        self.changed()

    def restore(self, endpoint: str, states: Sequence[Any]) -> None:
        """Write replica i `states[i]` through `endpoint` (a resumed checkpoint's state); when that is the
        service's state writer, a replacement then starts from it too."""
        for i, st in enumerate(states[:len(self.replicas)]):
            getattr(self.replicas[i], endpoint).call_one(st).get()
            if self.state is not None and endpoint == self.state[1]:
                self.snapshots[i] = st

    def retire(self, i: int, reason: str) -> None:
        self.alive[i] = False
        self.generation[i] += 1
        self.stats.retired += 1
        self._event(f"{self.labels[i]} retired: {reason}")
        if self.healthy():
            self.changed()

    def add_replica(self, handle: Any, label: str = "") -> int:
        """A new replica (elastic scale-up between steps); it receives the sticky state first."""
        for endpoint, args in self.sticky.items():
            if args is not None:
                getattr(handle, endpoint).call_one(*args).get()
        self.replicas.append(handle)
        self.alive.append(True)
        self.generation.append(0)
        self.failures.append(0)
        self.labels.append(label or f"{self.name}[{len(self.replicas) - 1}]")
        self._event(f"{self.labels[-1]} added")
        self.changed()
        return len(self.replicas) - 1

    def _event(self, msg: str) -> None:
        self.events.append(msg)
        self.log(f"{self.name}: {msg}")

    def metrics(self) -> dict[str, float]:
        s, p = self.stats, f"service/{self.name}/"
        return {p + "issued": float(s.issued), p + "retried": float(s.retried), p + "completed": float(s.completed),
                p + "failures": float(s.failures), p + "respawned": float(s.respawned),
                p + "retired": float(s.retired), p + "replicas": float(len(self.healthy()))}

    def __getattr__(self, endpoint: str) -> _Endpoint:
        if endpoint.startswith("_"):
            raise AttributeError(endpoint)
        return _Endpoint(self, endpoint)

    def __len__(self) -> int:
        return len(self.healthy())


class _CollectiveEndpoint:
    def __init__(self, mesh: Any, name: str) -> None:
        self.endpoint = getattr(mesh, name)

    def call(self, *args: Any) -> Any:
        """Enter the collective on every rank and return rank 0's answer."""
        return self.start(*args).get()

    def start(self, *args: Any) -> Pending[Any]:
        return Pending([self.endpoint.call(*args)], lambda parts: next(iter(parts[0].values())))


class Collective:
    """An actor with one instance per rank whose endpoints are collectives (trainer, reference)."""

    def __init__(self, name: str, mesh: Any) -> None:
        self.name, self.mesh = name, mesh

    def __getattr__(self, endpoint: str) -> _CollectiveEndpoint:
        if endpoint.startswith("_"):
            raise AttributeError(endpoint)
        return _CollectiveEndpoint(self.mesh, endpoint)


@dataclass
class Services:
    """Everything the loop talks to."""

    generators: Service
    trainer: Collective
    rewards: Service
    buffer: Service
    reference: Collective | None = None  # on the trainer's processes, only when algorithm.kl_coef > 0
    generator_seeds: tuple[int, ...] = ()  # one per generator shard; request seeds derive from them

    def replica_services(self) -> list[Service]:
        return [self.generators, self.rewards]

    def metrics(self) -> dict[str, float]:
        """Request accounting and replica health of every replicated service (cumulative over the run)."""
        return {k: v for s in self.replica_services() for k, v in s.metrics().items()}


class Done:
    """A result that is already there, shaped like a Monarch future."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self, timeout: float | None = None) -> Any:
        return self.value


class _LocalEndpoint:
    def __init__(self, obj: Any, fn: Callable[..., Any], events: asyncio.AbstractEventLoop) -> None:
        self.obj, self.fn, self.events = obj, fn, events

    def _run(self, *args: Any) -> Any:
        out = self.fn(self.obj, *args)
        return self.events.run_until_complete(out) if inspect.isawaitable(out) else out

    def call_one(self, *args: Any) -> Done:  # a replica's endpoint (Service)
        return Done(self._run(*args))

    def call(self, *args: Any) -> Done:  # a collective's endpoint: rank -> answer, one rank here
        return Done({"rank": self._run(*args)})


class Local:
    """An actor class instantiated in this process, reached through the same endpoint names as an actor handle:
    for light state the loop reads every step (the replay buffer), where a message each way costs more than
    the work, and for `rlexp.run.inprocess`. Calls run when made."""

    def __init__(self, cls: type, *args: Any, events: asyncio.AbstractEventLoop | None = None, **kwargs: Any) -> None:
        # Async endpoints run on `events` (shared by the Locals of one process, as an actor process has one loop).
        self.events, self.obj = events or asyncio.new_event_loop(), cls(*args, **kwargs)

    def __getattr__(self, name: str) -> _LocalEndpoint:
        prop = inspect.getattr_static(type(self.obj), name, None)
        fn = getattr(prop, "_method", None)
        if fn is None:
            raise AttributeError(f"{type(self.obj).__name__} has no endpoint {name!r}")
        return _LocalEndpoint(self.obj, fn, self.events)
