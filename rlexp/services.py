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


class _Endpoint:
    def __init__(self, service: Service, name: str) -> None:
        self.service, self.name = service, name

    def _on(self, replica: int) -> Any:
        return getattr(self.service.replicas[replica], self.name)

    def route(self, *args: Any) -> Pending[Any]:
        """Call one replica, chosen round robin over the calls to this service."""
        r = self.service.next_replica()
        return Pending([self._on(r).call_one(*args)], lambda parts: parts[0])

    def call(self, *args: Any) -> Any:
        """`route(...).get()`: the usual way to talk to a single-replica service such as the buffer."""
        return self.route(*args).get()

    def fanout(self, *args: Any) -> Pending[list[Any]]:
        """Call every replica with the same arguments; results in replica order."""
        return Pending([self._on(r).call_one(*args) for r in range(len(self.service.replicas))], list)

    def scatter(self, items: Sequence[Any], *args: Any, unit: int = 1,
                per_shard: Callable[[int], tuple[Any, ...]] | None = None,
                rows: Sequence[Sequence[Any]] = ()) -> Pending[list[Any]]:
        """Split `items` (and the parallel sequences in `rows`) into one contiguous slice of whole
        `unit`s per replica and call `endpoint(items_slice, *rows_slices, *args, *per_shard(i))` on
        replica i. Returns the per-slice results in item order. `per_shard` gives arguments that belong
        to a slice, such as its sampling seed, so a slice's result does not depend on which replica
        serves it."""
        futures = []
        for i, (a, b) in enumerate(shard_bounds(len(items), len(self.service.replicas), unit)):
            extra = per_shard(i) if per_shard is not None else ()
            futures.append(self._on(i).call_one(list(items[a:b]), *[list(r[a:b]) for r in rows], *args, *extra))
        return Pending(futures, list)


class Service:
    """Replicas of one actor (each a Monarch actor mesh of one process)."""

    def __init__(self, name: str, replicas: list[Any]) -> None:
        if not replicas:
            raise ValueError(f"service {name!r} has no replicas")
        self.name, self.replicas = name, list(replicas)
        self._next = 0

    def next_replica(self) -> int:
        r = self._next % len(self.replicas)
        self._next += 1
        return r

    def __getattr__(self, endpoint: str) -> _Endpoint:
        if endpoint.startswith("_"):
            raise AttributeError(endpoint)
        return _Endpoint(self, endpoint)

    def __len__(self) -> int:
        return len(self.replicas)


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
    generator_seeds: tuple[int, ...] = ()  # one per generator replica; request seeds derive from them
