"""Builds a weight transport by name; imports the implementations (the base module does not)."""
from __future__ import annotations

from typing import Any

from rlexp.transport.base import TRANSPORTS, TransportError, WeightTransport
from rlexp.transport.shm import ShmTransport, check_shm
from rlexp.transport.torchstore import TorchStoreTransport, check_torchstore


def check_transport(name: str, *, hosts: int = 1) -> None:
    """Raise `TransportError` now if `name` cannot work here, with what to do instead.

    `hosts` is the number of hosts the trainer and generators span: shm cannot cross hosts.
    """
    if name == "shm":
        check_shm(hosts=hosts)
    elif name == "torchstore":
        check_torchstore()
    else:
        raise TransportError(f"unknown weight transport {name!r}; choose one of {TRANSPORTS}")


def build_transport(name: str, run_name: str, **options: Any) -> WeightTransport:
    check_transport(name, hosts=options.pop("hosts", 1))
    if name == "shm":
        return ShmTransport(run_name, **options)
    return TorchStoreTransport(run_name, **options)
