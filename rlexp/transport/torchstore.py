"""Weight sync through TorchStore (meta-pytorch/torchstore), for layouts that span hosts.

Written against TorchStore's public async API (`initialize`, `put_state_dict`, `get_state_dict`,
`keys`, `delete`/`delete_batch`, `shutdown`; the same in release 0.1.2 and on main). Used only when a
TorchStore that works with the installed Monarch is importable; `check_torchstore` says why not
otherwise, at start rather than as a hang or a ValueError inside an actor.

Known pairing problem: TorchStore 0.1.2 (the last release, pinned to torchmonarch 0.1.2) defines a
Controller actor with both sync and async endpoints; Monarch >= 0.2 refuses such actors
("... mixes both async and sync endpoints"), fixed upstream after the release (torchstore PR #74).
"""
from __future__ import annotations

import asyncio
import importlib.metadata as md
import os
import re
from typing import Any

import torch

from rlexp.transport.base import TransportError, WeightReceiver, WeightTransport, register_transport

URI = "torchstore://"
IGNORE_PIN_ENV = "RLEXP_TORCHSTORE_IGNORE_PIN"


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def _install_hint(monarch: str | None) -> str:
    return (f"install a TorchStore built for the installed Monarch (torchmonarch {monarch}) from source, e.g. "
            f"`pip install --no-deps git+https://github.com/meta-pytorch/torchstore@<commit>` choosing a commit whose "
            f"pyproject.toml pins torchmonarch=={monarch} (PyPI's torchstore 0.1.2 only works with torchmonarch 0.1.x; "
            f"torchstore main as of mid-2026 pins torchmonarch==0.4.1); "
            f"or use cluster.transport=auto (shm on one host, Monarch messages across hosts): no TorchStore needed")


def check_torchstore() -> None:
    monarch = _version("torchmonarch")
    try:
        import torchstore
    except ImportError as e:
        raise TransportError(f"transport=torchstore: TorchStore is not installed ({e}). "
                             f"{_install_hint(monarch)}") from None
    ts_ver = _version("torchstore") or getattr(torchstore, "__version__", "unknown")
    # 1. Monarch's own rule, applied to TorchStore's actor classes (what would fail at spawn time).
    try:
        from monarch._src.actor.actor_mesh import _actor_kind
    except ImportError:
        _actor_kind = None
    if _actor_kind is not None:
        for mod, cls_name in (("torchstore.controller", "Controller"), ("torchstore.storage_volume", "StorageVolume")):
            try:
                cls = getattr(__import__(mod, fromlist=[cls_name]), cls_name)
            except (ImportError, AttributeError):
                continue
            try:
                _actor_kind(cls)
            except ValueError as e:
                raise TransportError(f"transport=torchstore: TorchStore {ts_ver} does not work with Monarch {monarch}: "
                                     f"{e} {_install_hint(monarch)}") from None
    elif monarch and _vtuple(monarch) >= (0, 2) and ts_ver != "unknown" and _vtuple(ts_ver) <= (0, 1, 2):
        raise TransportError(f"transport=torchstore: TorchStore {ts_ver} mixes both async and sync endpoints, which "
                             f"Monarch {monarch} refuses. {_install_hint(monarch)}")
    # 2. The Monarch version this TorchStore declares; other pairings are untested upstream.
    pins = [r for r in (md.requires("torchstore") or []) if re.match(r"torchmonarch\s*==", r)]
    if pins and monarch and os.environ.get(IGNORE_PIN_ENV) != "1":
        want = pins[0].split("==", 1)[1].split(";")[0].strip()
        if want != monarch:
            raise TransportError(f"transport=torchstore: TorchStore {ts_ver} requires torchmonarch=={want}, installed "
                                 f"{monarch}. {_install_hint(monarch)} (set {IGNORE_PIN_ENV}=1 to try anyway)")


def _run(coro):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("inside an event loop (a Monarch async endpoint): await apublish/afetch instead")


class TorchStoreReceiver(WeightReceiver):
    """Generator side: reads from the store the trainer started (`cluster.transport_options.torchstore.store_name`
    names a non-default one)."""

    store: TorchStoreTransport | None = None

    async def afetch(self, version: int, location: str) -> dict[str, torch.Tensor]:
        if self.store is None:
            self.store = TorchStoreTransport("generator", store_name=self.settings.get("store_name"))
        return await self.store.afetch(location)


@register_transport("torchstore")
class TorchStoreTransport(WeightTransport):
    """Each version is one TorchStore state dict under key `rlexp/<run>/v<version>`."""

    receiver = TorchStoreReceiver

    @classmethod
    def check(cls, settings: dict[str, Any], *, hosts: int = 1) -> None:
        super().check(settings, hosts=hosts)
        check_torchstore()

    def __init__(self, run_name: str, *, keep: int = 2, store_name: str | None = None) -> None:
        import torchstore as ts

        self.ts = ts
        self.prefix = f"rlexp/{run_name}"
        self.keep = keep
        self.store_kw = {"store_name": store_name} if store_name else {}
        self._published: list[int] = []

    def key(self, version: int) -> str:
        return f"{self.prefix}/v{version}"

    async def ainitialize(self, **kwargs) -> None:
        """Spawn the store (once per run, from the process that owns the Monarch context)."""
        await self.ts.initialize(**kwargs, **self.store_kw)

    async def astart(self) -> None:
        """The trainer starts the store in `Trainer.setup` (untested here: no TorchStore for Monarch 0.7 installs)."""
        await self.ainitialize()

    async def apublish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        await self.ts.put_state_dict({k: v.detach() for k, v in hf_state_dict.items()}, self.key(version),
                                     **self.store_kw)
        self._published.append(version)
        while len(self._published) > self.keep:
            await self._delete_version(self._published.pop(0))
        return URI + self.key(version)

    async def afetch(self, location: str) -> dict[str, torch.Tensor]:
        if not location.startswith(URI):
            raise TransportError(f"transport=torchstore: {location!r} is not a {URI} location")
        return await self.ts.get_state_dict(location[len(URI):], **self.store_kw)

    async def _delete_version(self, version: int) -> None:
        keys = await self.ts.keys(self.key(version) + "/", **self.store_kw)
        if hasattr(self.ts, "delete_batch"):
            await self.ts.delete_batch(keys, **self.store_kw)
        else:  # TorchStore 0.1.x
            for k in keys:
                await self.ts.delete(k, **self.store_kw)

    def publish(self, version: int, hf_state_dict: dict[str, torch.Tensor]) -> str:
        return _run(self.apublish(version, hf_state_dict))

    def fetch(self, location: str) -> dict[str, torch.Tensor]:
        return _run(self.afetch(location))

    async def aclose(self) -> None:
        for v in self._published:
            await self._delete_version(v)
        self._published.clear()

    def close(self) -> None:
        if self._published:
            _run(self.aclose())
