"""Transport interface and registry."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch

TRANSPORTS = ("shm", "monarch", "torchstore")  # what a trainer->generator pair can use
CHOICES = ("auto", *TRANSPORTS)  # what `cluster.transport` accepts; auto: shm on one host, monarch across


class TransportError(RuntimeError):
    """The transport cannot work in this environment/layout; raised at start, before spawning."""


class WeightTransport(ABC):
    """Trainer side publishes a version; generator side turns a location back into weights.

    A location is a string so it can travel through a Monarch endpoint as-is: `Trainer.push_weights` returns
    {transport: location} and each `Generator.update_weights(version, locations)` picks its own. For `shm`
    it is a folder of HF safetensors; for `monarch` a `monarch://<run>/v<version>` key served by the
    trainer-side `WeightServer`; for `torchstore` a `torchstore://<key>` URI. Generators of the in-memory
    transports load the fetched state dict (`GeneratorBackend.load_state_dict`; vLLM via a local folder).
    """

    name: str

    @abstractmethod
    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        """Make `version` available; returns its location. Old versions beyond `keep` are dropped."""

    @abstractmethod
    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        """The HF-named state dict at `location` (CPU tensors)."""

    async def astart(self) -> None:  # noqa: B027 - optional: only a transport with a service to start has one
        """Trainer side, once in `Trainer.setup` (inside the actor's event loop)."""

    async def apublish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        """`publish` from inside an event loop (the trainer's endpoints); TorchStore overrides it."""
        return self.publish(version, hf_state_dict)

    async def afetch(self, location: str) -> dict[str, torch.Tensor]:
        return self.fetch(location)

    def materialize(self, location: str, local_dir: str | Path | None = None) -> Path:
        """A local folder of HF safetensors for `location` (what vLLM reloads from)."""
        return Path(location)

    def close(self) -> None:  # noqa: B027 - optional: a transport with nothing to release keeps this no-op
        """Release everything this transport published (trainer side, at teardown)."""


WeightSpec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def spec_of(sd: dict[str, torch.Tensor]) -> WeightSpec:
    return {k: (tuple(v.shape), v.dtype) for k, v in sd.items()}


def check_weights(version: int, got: WeightSpec, own: WeightSpec, *, where: str, check_dtype: bool = True) -> None:
    """Refuse, before anything is loaded, weights that do not fit the generator's own parameters: a
    wrong model (names), a wrong size (shapes) or a wrong precision (dtypes; vLLM casts on load, so its
    backend skips that one)."""
    missing, unexpected = sorted(set(own) - set(got)), sorted(set(got) - set(own))
    shapes = [f"{k}: {got[k][0]} != own {own[k][0]}" for k in sorted(set(got) & set(own)) if got[k][0] != own[k][0]]
    dtypes = [f"{k}: {got[k][1]} != own {own[k][1]}" for k in sorted(set(got) & set(own))
              if check_dtype and got[k][1] != own[k][1]]
    if missing or unexpected or shapes or dtypes:
        raise TransportError(
            f"generator: version {version} from {where} does not match this generator's model: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}, shape {shapes[:3]}, dtype {dtypes[:3]} "
            f"({len(missing)}/{len(unexpected)}/{len(shapes)}/{len(dtypes)}); the trainer and generators must load "
            f"the same `model=` (and model.dtype); nothing was loaded")
