"""Builds a weight transport by name and chooses one per trainer->generator pair; imports the
implementations (the base module does not)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlexp.transport.base import CHOICES, TRANSPORTS, TransportError, WeightTransport
from rlexp.transport.shm import ShmTransport, check_shm
from rlexp.transport.torchstore import TorchStoreTransport, check_torchstore


def pair_transport(choice: str, trainer_host: str, generator_host: str) -> str:
    """The transport one trainer->generator pair uses: `auto` is shm when both share a host (one write to
    RAM that every reader on the host maps) and monarch otherwise (Monarch actor messages cross hosts).
    An explicit choice is kept, except shm across hosts, which cannot work and is refused."""
    if choice not in CHOICES:
        raise TransportError(f"unknown weight transport {choice!r}; choose one of {CHOICES}")
    same = trainer_host == generator_host
    if choice == "auto":
        return "shm" if same else "monarch"
    if choice == "shm" and not same:
        raise TransportError(f"cluster.transport=shm: the trainer is on host {trainer_host!r} and a generator on "
                             f"{generator_host!r}, but /dev/shm is per host; use cluster.transport=auto (shm on one "
                             f"host, monarch across hosts) or cluster.transport=monarch")
    return choice


def pair_transports(choice: str, trainer_host: str, generator_hosts: Sequence[str]) -> list[str]:
    """`pair_transport` for every generator replica, checked (each distinct transport once) before spawning."""
    out = [pair_transport(choice, trainer_host, h) for h in generator_hosts]
    for name in dict.fromkeys(out):
        check_transport(name)
    return out


def check_transport(name: str, *, hosts: int = 1) -> None:
    """Raise `TransportError` now if `name` cannot work here, with what to do instead.

    `hosts` is the number of hosts the trainer and generators span: shm cannot cross hosts.
    """
    if name == "shm":
        check_shm(hosts=hosts)
    elif name == "torchstore":
        check_torchstore()
    elif name not in ("auto", "monarch"):  # monarch needs nothing beyond Monarch itself
        raise TransportError(f"unknown weight transport {name!r}; choose one of {CHOICES}")


def build_transport(name: str, run_name: str, *, keep: int = 2, shm_root: str | None = None,
                    chunk_bytes: int | None = None, **options: Any) -> WeightTransport:
    """Trainer side of `name` (one of `TRANSPORTS`; resolve `auto` per pair first), with the options that apply
    to it: `shm_root` to shm, `chunk_bytes` to monarch."""
    if name not in TRANSPORTS:
        raise TransportError(f"cannot build transport {name!r}: resolve it per pair first (pair_transport); "
                             f"built ones are {TRANSPORTS}")
    check_transport(name, hosts=options.pop("hosts", 1))
    if name == "shm":
        return ShmTransport(run_name, root=shm_root, keep=keep, **options)
    if name == "monarch":
        from rlexp.transport.monarch import DEFAULT_CHUNK_BYTES, MonarchTransport

        return MonarchTransport(run_name, keep=keep, chunk_bytes=chunk_bytes or DEFAULT_CHUNK_BYTES)
    return TorchStoreTransport(run_name, keep=keep, **options)
