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

    def close(self) -> None:  # noqa: B027 - optional: a transport with nothing to release keeps this no-op
        """Release everything this transport published (trainer side, at teardown)."""
