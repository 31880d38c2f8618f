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
