"""Transports by name: imports the built-ins (so their `@register_transport` runs; the base module does not),
resolves `cluster.transport`, picks one per trainer->generator pair and builds either side from a
`TransportSpec`. A new transport is one module: a registered `WeightTransport` with its `WeightReceiver`,
named in config as `package.module:Class` (or imported below, for a built-in)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import rlexp.transport.monarch
import rlexp.transport.shm
import rlexp.transport.tcp
import rlexp.transport.torchstore  # noqa: F401 - the built-ins register themselves on import
from rlexp.config.schema import ClusterConfig
from rlexp.registry import PluginError, import_module
from rlexp.transport.base import TRANSPORTS, TransportError, TransportSpec, WeightReceiver, WeightTransport

AUTO = "auto"  # shm when a pair shares a host, tcp across hosts
AUTO_PAIR = ("shm", "tcp")  # what `auto` picks: (one host, across hosts)


def choices() -> list[str]:
    """What `cluster.transport` accepts besides `package.module:Class`."""
    return [AUTO, *TRANSPORTS.names()]


def resolve(name: str) -> type[WeightTransport]:
    """The transport class `name` stands for: a registered name, or `package.module:Class` (imported here; found
    like any plug-in, `rlexp.core.plugins`: on sys.path, in the working folder or beside a `config_path` folder)."""
    if name == AUTO:
        raise TransportError(f"cluster.transport={AUTO} picks a transport per pair; resolve it "
                             f"with pair_transport")
    try:
        return TRANSPORTS.get(name)
    except PluginError as e:  # every registry's lookup and wording; the type callers expect
        raise TransportError(str(e)) from None


def candidates(choice: str) -> list[type[WeightTransport]]:
    """The transports `cluster.transport=choice` may use in a run: `auto`'s two, or the one named.
    """
    return [TRANSPORTS[n] for n in AUTO_PAIR] if choice == AUTO else [resolve(choice)]


def release_stale(cluster: ClusterConfig) -> None:
    """Set-up before a run: each transport the run may use removes what dead runs left
    (`release_stale`)."""
    for cls in candidates(cluster.transport):
        if cls.leaves_files:
            cls.release_stale(cls.settings(cluster))


def release(cluster: ClusterConfig, run_name: str) -> None:
    """Clean-up after a run, also when the trainer died first: each transport removes what the run
    published."""
    for cls in candidates(cluster.transport):
        if cls.leaves_files:
            cls.release(cls.settings(cluster), run_name)


def server_actor(name: str) -> str:
    """The actor name of transport `name`'s server (`WeightTransport.server_actor`, default
    weights_<name>)."""
    return resolve(name).server_actor or f"weights_{name}"


def pair_transport(choice: str, trainer_host: str, generator_host: str) -> str:
    """The transport one trainer->generator pair uses: `auto` is shm when both share a host (one write to
    RAM that every reader on the host maps) and tcp otherwise (a socket stream at the speed of a plain socket
    copy; Monarch actor messages, `monarch`, reach 0.01-0.02x of that, studies/perf/results/perf_cpu.md).
    An explicit choice is kept, except a one-host transport (shm) across hosts, which cannot work and is refused."""
    same = trainer_host == generator_host
    if choice == AUTO:
        return AUTO_PAIR[0] if same else AUTO_PAIR[1]
    cls = resolve(choice)
    if cls.one_host and not same:
        raise TransportError(f"cluster.transport={choice}: the trainer is on host {trainer_host!r} and a generator on "
                             f"{generator_host!r}, but {cls.name} works within one host only; use "
                             f"cluster.transport=auto (shm on one host, tcp across hosts) or "
                             f"cluster.transport=tcp")
    return cls.name


def pair_transports(choice: str, trainer_host: str, generator_hosts: Sequence[str],
                    cluster: ClusterConfig | None = None) -> list[str]:
    """`pair_transport` for every generator replica, checked (each distinct transport once, with its settings
    from `cluster` when given) before spawning."""
    out = [pair_transport(choice, trainer_host, h) for h in generator_hosts]
    for name in dict.fromkeys(out):
        check_transport(name, cluster=cluster)
    return out


def check_transport(name: str, *, hosts: int = 1, cluster: ClusterConfig | None = None) -> None:
    """Raise `TransportError` now if `name` cannot work here (an unknown name lists the known ones), with what to do
    instead. `hosts` is the number of hosts the trainer and generators span; `cluster`, when given, supplies the
    transport's settings, which are checked too."""
    if name == AUTO:  # shm and tcp, each only where it works
        return
    cls = resolve(name)
    cls.check(cls.settings(cluster) if cluster is not None else {}, hosts=hosts)


def transport_spec(name: str, run_name: str, cluster: ClusterConfig) -> TransportSpec:
    """What the trainer and a generator get for transport `name` (a resolved pair's, not `auto`)."""
    cls = resolve(name)
    return TransportSpec(cls.name, cls.__module__, run_name, cls.settings(cluster))


def _loaded(spec: TransportSpec) -> type[WeightTransport]:
    import_module(spec.module, f"weight transport {spec.name}")  # registers one from outside
    cls = TRANSPORTS.find(spec.name)
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
