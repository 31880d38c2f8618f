"""One run seed -> a distinct, recorded seed per component.

Derived by hashing (seed, component name) rather than seed+offset so that adding a component or a
replica never shifts the seeds of the others, and two components never share a stream by accident.
"""
from __future__ import annotations

import hashlib

COMPONENTS = ("data", "trainer", "buffer", "eval", "reward")


def derive_seed(seed: int, component: str) -> int:
    digest = hashlib.sha256(f"rlexp:{seed}:{component}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def component_seeds(seed: int, generator_replicas: int) -> dict[str, int]:
    names = list(COMPONENTS) + [f"generator/{i}" for i in range(generator_replicas)]
    return {name: derive_seed(seed, name) for name in names}


def request_seed(replica_seed: int, step: int, call: int = 0) -> int:
    """Per-request sampling seed: reproducible whatever the routing, and across resume."""
    return derive_seed(replica_seed, f"step{step}/call{call}")
