"""Transports by name: imports the built-ins (so their `@register_transport` runs; the base module does not),
resolves `cluster.transport`, picks one per trainer->generator pair and builds either side from a
`TransportSpec`. A new transport is one module: a registered `WeightTransport` with its `WeightReceiver`,
named in config as `package.module:Class` (or imported below, for a built-in)."""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import rlexp.transport.monarch
import rlexp.transport.shm
import rlexp.transport.tcp
import rlexp.transport.torchstore  # noqa: F401 - the built-ins register themselves on import
from rlexp.config.schema import TrainConfig
from rlexp.registry import IMPORTED, PluginError, import_module
from rlexp.transport.base import TRANSPORTS, TransportError, TransportSpec, WeightReceiver, WeightTransport

AUTO = "auto"  # shm when a pair shares a host, tcp across hosts


def choices() -> list[str]:
    """What `cluster.transport` accepts besides `package.module:Class`."""
    return [AUTO, *sorted(TRANSPORTS)]


def resolve(name: str) -> type[WeightTransport]:
    """The transport class `name` stands for: a registered name, or `package.module:Class` (imported here; found
    like any plug-in, `rlexp.core.plugins`: on sys.path, in the working folder or beside a `config_path` folder)."""
    if ":" in name:
        mod, _, attr = name.partition(":")
        try:  # the same import (and error: module, cause, sys.path) as every other plug-in (rlexp.registry)
            cls = getattr(import_module(mod, f"cluster.transport={name}"), attr, None)
        except PluginError as e:
            raise TransportError(str(e)) from None
        if not (isinstance(cls, type) and issubclass(cls, WeightTransport)) or TRANSPORTS.get(cls.name) is not cls:
            raise TransportError(f"cluster.transport={name}: {mod} has no WeightTransport subclass {attr!r} "
                                 f"registered with @rlexp.transport.base.register_transport")
        IMPORTED[mod] = None  # recorded in the manifest with its source hash, like every plug-in
        return cls
    cls = TRANSPORTS.get(name)
    if cls is None:
        raise TransportError(f"unknown weight transport {name!r}; choose one of {choices()}, or name a transport "
                             f"module's class as package.module:Class")
    return cls


def pair_transport(choice: str, trainer_host: str, generator_host: str) -> str:
    """The transport one trainer->generator pair uses: `auto` is shm when both share a host (one write to
    RAM that every reader on the host maps) and tcp otherwise (a socket stream at the speed of a plain socket
    copy; Monarch actor messages, `monarch`, reach 0.01-0.02x of that, studies/perf/results/perf_cpu.md).
    An explicit choice is kept, except a one-host transport (shm) across hosts, which cannot work and is refused."""
    same = trainer_host == generator_host
    if choice == AUTO:
        return "shm" if same else "tcp"
    cls = resolve(choice)
    if cls.one_host and not same:
        raise TransportError(f"cluster.transport={choice}: the trainer is on host {trainer_host!r} and a generator on "
                             f"{generator_host!r}, but {cls.name} works within one host only; use "
                             f"cluster.transport=auto (shm on one host, tcp across hosts) or "
                             f"cluster.transport=tcp")
    return cls.name


def pair_transports(choice: str, trainer_host: str, generator_hosts: Sequence[str],
                    cfg: TrainConfig | None = None) -> list[str]:
    """`pair_transport` for every generator replica, checked (each distinct transport once, with its settings
    from `cfg` when given) before spawning."""
    out = [pair_transport(choice, trainer_host, h) for h in generator_hosts]
    for name in dict.fromkeys(out):
        check_transport(name, cfg=cfg)
    return out


def check_transport(name: str, *, hosts: int = 1, cfg: TrainConfig | None = None) -> None:
    """Raise `TransportError` now if `name` cannot work here (an unknown name lists the known ones), with what to do
    instead. `hosts` is the number of hosts the trainer and generators span; `cfg`, when given, supplies the
    transport's settings, which are checked too."""
    if name == AUTO:  # shm and tcp, each only where it works
        return
    cls = resolve(name)
    cls.check(cls.settings(cfg) if cfg is not None else {}, hosts=hosts)


def transport_spec(name: str, run_name: str, cfg: TrainConfig) -> TransportSpec:
    """What the trainer and a generator get for transport `name` (a resolved pair's, not `auto`)."""
    cls = resolve(name)
    return TransportSpec(cls.name, cls.__module__, run_name, cls.settings(cfg))


def _loaded(spec: TransportSpec) -> type[WeightTransport]:
    importlib.import_module(spec.module)  # registers a transport rlexp does not import (a no-op otherwise)
    cls = TRANSPORTS.get(spec.name)
    if cls is None:
        raise TransportError(f"weight transport {spec.name!r}: importing {spec.module} did not register it")
    return cls


def build_publisher(spec: TransportSpec, *, keep: int = 2) -> WeightTransport:
    """Trainer side of `spec`, checked first."""
    cls = _loaded(spec)
    cls.check(spec.settings)
    return cls(spec.run_name, keep=keep, **spec.settings)


def build_receiver(spec: TransportSpec) -> WeightReceiver:
    """Generator side of `spec`."""
    cls = _loaded(spec)
    return cls.receiver(spec.run_name, spec.settings)


def build_transport(name: str, run_name: str, *, keep: int = 2, **settings: Any) -> WeightTransport:
    """Trainer side of `name` with explicit settings (tests, bench); runs use `build_publisher`."""
    if name == AUTO:
        raise TransportError(f"cannot build transport {name!r}: resolve it per pair first (pair_transport)")
    cls = resolve(name)
    return build_publisher(TransportSpec(cls.name, cls.__module__, run_name, settings), keep=keep)
