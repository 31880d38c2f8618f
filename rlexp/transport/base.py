"""Transport interface and registry."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch

TRANSPORTS = ("shm", "torchstore")


class TransportError(RuntimeError):
    """The transport cannot work in this environment/layout; raised at start, before spawning."""


class WeightTransport(ABC):
    """Trainer side publishes a version; generator side turns a location back into weights.

    A location is a string so it can travel through a Monarch endpoint as-is: `Generator.update_weights
    (version, path)` receives it. For `shm` it is a folder of HF safetensors; for `torchstore` a
    `torchstore://<key>` URI (use `materialize` to get a folder for vLLM).
    """

    name: str

    @abstractmethod
    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        """Make `version` available; returns its location. Old versions beyond `keep` are dropped."""

    @abstractmethod
    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        """The HF-named state dict at `location` (CPU tensors)."""

    def materialize(self, location: str, local_dir: str | Path | None = None) -> Path:
        """A local folder of HF safetensors for `location` (what vLLM reloads from)."""
        return Path(location)

    def close(self) -> None:
        """Release everything this transport published (trainer side, at teardown)."""


def check_transport(name: str, *, hosts: int = 1) -> None:
    """Raise `TransportError` now if `name` cannot work here, with what to do instead.

    `hosts` is the number of hosts the trainer and generators span: shm cannot cross hosts.
    """
    if name == "shm":
        from rlexp.transport.shm import check_shm

        check_shm(hosts=hosts)
    elif name == "torchstore":
        from rlexp.transport.torchstore import check_torchstore

        check_torchstore()
    else:
        raise TransportError(f"unknown weight transport {name!r}; choose one of {TRANSPORTS}")


def build_transport(name: str, run_name: str, **options) -> WeightTransport:
    check_transport(name, hosts=options.pop("hosts", 1))
    if name == "shm":
        from rlexp.transport.shm import ShmTransport

        return ShmTransport(run_name, **options)
    from rlexp.transport.torchstore import TorchStoreTransport

    return TorchStoreTransport(run_name, **options)
