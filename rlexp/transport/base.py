"""Transport interface and the registry of transports by name (implementations register themselves here;
this module imports none of them).

A transport is one module: a trainer-side publisher (a `WeightTransport` subclass, registered with
`@register_transport("name")`) and a generator-side receiver (its `receiver` class, a `WeightReceiver`). The
trainer and the generators know a transport only through a `TransportSpec`: its name, the module that registers
it (imported first in an actor's process, so a transport outside rlexp works too) and its settings, built from
the run's config by the transport itself (`WeightTransport.settings`). `cluster.transport` names a registered
transport, `auto`, or `package.module:Class` for one that no rlexp module imports.
"""
from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from rlexp.core.weights import TransportError, WeightSpec, check_weights, spec_of
from rlexp.registry import Registry

if TYPE_CHECKING:
    from rlexp.config.schema import ClusterConfig

__all__ = ["TRANSPORTS", "TransportError", "TransportSpec", "WeightReceiver", "WeightSink", "WeightSpec",
           "WeightTransport", "check_weights", "register_transport", "spec_of"]


class WeightSink(Protocol):
    """What a receiver loads into: a generator backend (`rlexp.models.backends.GeneratorBackend`).

    A backend may also offer `serve_mapped(version, hf_tensors, release) -> bool`: use the given tensors (views of
    a transport's read-only mapping) as its weights without copying, and call `release` once it serves another
    version; False declines (the receiver then loads by copying). The shm receiver uses it when present."""

    def load_state_dict(self, version: int, hf_state_dict: dict[str, torch.Tensor], where: str) -> None: ...

    def load_folder(self, version: int, folder: str, check: Callable[[], None] | None = None) -> None: ...


class WeightReceiver:
    """Generator side: turns a location published by its transport back into weights inside a backend.

    The default fetches an HF-named state dict (`afetch`) and hands it to `WeightSink.load_state_dict`, which
    checks it against the generator's own parameters before copying; a transport whose locations are folders
    overrides `receive` to let the backend read the folder itself (vLLM reloads from one)."""

    def __init__(self, run_name: str, settings: dict[str, Any]) -> None:
        self.run_name, self.settings = run_name, settings

    def connect(self, server: Any) -> None:
        """The transport's server actor (`WeightTransport.server`), handed over by the launcher after spawning."""

    async def afetch(self, version: int, location: str) -> dict[str, torch.Tensor]:
        raise NotImplementedError(f"{type(self).__name__} implements neither afetch nor receive")

    async def receive(self, version: int, location: str, backend: WeightSink) -> None:
        backend.load_state_dict(version, await self.afetch(version, location), where=location)


class WeightTransport(ABC):
    """Trainer side: publishes a version and says where it is.

    A location is a string so it can travel through a Monarch endpoint as-is: `Trainer.push_weights` returns
    {transport: location} and each `Generator.update_weights(version, locations)` picks its own. For `shm`
    it is a folder of HF safetensors; for `monarch` a `monarch://<run>/v<version>` key served by the
    trainer-side `WeightServer`; for `torchstore` a `torchstore://<key>` URI.

    Class attributes describe the transport to the launcher: `receiver` (the generator side), `one_host`
    (works only when the trainer and the generator share a host: refused across hosts), `server` (an actor
    class the launcher spawns on the trainer's first process and connects every receiver to, or None).
    Constructed as `cls(run_name, keep=keep, **settings)`.
    """

    name: ClassVar[str] = ""
    receiver: ClassVar[type[WeightReceiver]] = WeightReceiver
    one_host: ClassVar[bool] = False
    server: ClassVar[type | None] = None
    # The name of the server actor, when `server` is set (default `weights_<name>`).
    server_actor: ClassVar[str] = ""
    # Whether it leaves anything behind that outlives a run which died without tearing down (files
    # in /dev/shm): the controller calls `release_stale` before a run and `release` after it for
    # every such transport the run's `cluster.transport` may pick.
    leaves_files: ClassVar[bool] = False

    @classmethod
    def settings(cls, cluster: ClusterConfig) -> dict[str, Any]:
        """This transport's settings from the run's `cluster` section, the part of the config a
        transport reads (plain values: they travel to the actors as-is). The default is
        `cluster.transport_options.<name>`."""
        options = getattr(cluster, "transport_options", None) or {}
        return dict(options.get(cls.name) or {})

    @classmethod  # noqa: B027 - optional: most transports leave nothing behind
    def release_stale(cls, settings: dict[str, Any]) -> None:
        """Set-up before a run: remove what runs that died without tearing down left (their process
        is gone). Only what this transport itself made may be touched."""

    @classmethod  # noqa: B027 - optional, as above
    def release(cls, settings: dict[str, Any], run_name: str) -> None:
        """Clean-up after a run (also when the trainer died first): remove what this run published.
        """

    @classmethod
    def check(cls, settings: dict[str, Any], *, hosts: int = 1) -> None:
        """Raise `TransportError` now (in `prepare`, before anything spawns) if this transport cannot work here
        with these settings; `hosts`: how many hosts the trainer and generators span. The default checks that
        the constructor takes the settings."""
        try:
            inspect.signature(cls).bind("run", keep=1, **settings)
        except TypeError as e:
            raise TransportError(f"cluster.transport_options.{cls.name}: {e}; {cls.__name__} takes "
                                 f"{list(inspect.signature(cls).parameters)[1:]}") from None

    @abstractmethod
    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        """Make `version` available; returns its location. Old versions beyond `keep` are dropped."""

    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        """The HF-named state dict at `location` (CPU tensors), read in the publishing process (tests, bench)."""
        raise NotImplementedError

    async def astart(self) -> None:  # noqa: B027 - optional: only a transport with a service to start has one
        """Trainer side, once in `Trainer.setup` (inside the actor's event loop)."""

    async def apublish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        """`publish` from inside an event loop (the trainer's endpoints); TorchStore overrides it."""
        return self.publish(version, hf_state_dict)

    async def afetch(self, location: str) -> dict[str, torch.Tensor]:
        return self.fetch(location)

    def close(self) -> None:  # noqa: B027 - optional: a transport with nothing to release keeps this no-op
        """Release everything this transport published (trainer side, at teardown)."""


@dataclass(frozen=True)
class TransportSpec:
    """Everything either side needs to build its end of one transport, opaque to the trainer and generators:
    picklable, so it travels to actor processes, which import `module` (registering the transport) first."""

    name: str
    module: str
    run_name: str
    settings: dict[str, Any] = field(default_factory=dict)


# name -> publisher class, filled by `register_transport`; a class named by import path must be
# registered (the generators rebuild its receiver by name).
TRANSPORTS: Registry[type[WeightTransport]] = Registry(
    "weight transport", WeightTransport,
    "a WeightTransport subclass registered with @rlexp.transport.base.register_transport",
    registered_only=True,
    also=("auto",))  # rlexp.transport.registry.AUTO: a pick per pair
register_transport = TRANSPORTS.register
