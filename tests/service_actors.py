"""A small real actor for tests/test_services.py (in its own module: spawned processes import it)."""
from __future__ import annotations

from monarch.actor import Actor, current_rank, endpoint


class Echo(Actor):
    def __init__(self, replica: int) -> None:
        self.replica = replica
        self.calls = 0

    @endpoint
    def who(self) -> int:
        self.calls += 1
        return self.replica

    @endpoint
    def tag(self, items: list[int], more: list[str], scale: int, seed: int) -> list[tuple[int, str, int, int, int]]:
        return [(x * scale, m, seed, self.replica, len(items)) for x, m in zip(items, more)]

    @endpoint
    def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def back(self, x: object) -> object:
        """`x` as it arrived: a message each way through Monarch's pickler."""
        return x


class Versioned(Actor):
    """A replica with state a replacement must be given (like a generator's weights version)."""

    def __init__(self, replica: int) -> None:
        self.replica, self.version = replica, None

    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()

    @endpoint
    def set_version(self, version: int) -> None:
        self.version = version

    @endpoint
    def work(self, items: list[int], seed: int) -> list[tuple[int, int | None]]:
        return [(x * seed, self.version) for x in items]

    @endpoint
    def who(self) -> tuple[int, int | None]:
        return self.replica, self.version


class Tally(Actor):
    """A replica whose answers depend on what it served before (like Weaver's label model and its label budget)."""

    def __init__(self, replica: int) -> None:
        self.replica, self.total, self.seen = replica, 0, 0

    @endpoint
    def pid(self) -> int:
        import os

        return os.getpid()

    @endpoint
    def add(self, items: list[int]) -> list[int]:
        out = []
        for x in items:
            self.total += x
            self.seen += 1
            out.append(self.total)
        return out

    @endpoint
    def state_dict(self) -> dict[str, int]:
        return {"total": self.total, "seen": self.seen}

    @endpoint
    def load_state_dict(self, state: dict[str, int]) -> None:
        self.total, self.seen = state["total"], state["seen"]


class Publisher(Actor):
    """Trainer stand-in for the transport tests: publishes given state dicts by shm and by monarch from its
    process (where a real `WeightServer` is spawned next to it, as the launcher does on the trainer's)."""

    def __init__(self, run_name: str, chunk_bytes: int, shm_root: str, keep: int = 2) -> None:
        from rlexp.transport.monarch import MonarchTransport
        from rlexp.transport.shm import ShmTransport

        self.transports = {"monarch": MonarchTransport(run_name, keep=keep, chunk_bytes=chunk_bytes),
                           "shm": ShmTransport(run_name, root=shm_root, keep=keep)}

    @endpoint
    async def publish(self, version: int, sd: dict, names: list[str]) -> dict[str, str]:
        return {n: self.transports[n].publish(version, sd) for n in names}

    @endpoint
    async def close(self) -> None:
        for t in self.transports.values():
            t.close()


class Fetcher(Actor):
    """Generator-side stand-in: pulls a version from a `WeightServer` on another process mesh."""

    @endpoint
    async def fetch(self, server: object, location: str, version: int) -> dict:
        from rlexp.transport.monarch import MonarchWeightClient

        return await MonarchWeightClient(server).afetch(location, version)
