"""Job kinds (`cluster.job`) as registered backends: each kind is one module under rlexp/cluster/jobs/ that says
what it needs (the Monarch job it builds, its checks, whether its hosts share the controller's machine, whether
the trainer's rendezvous port must be found on a remote host, how placement describes it), so adding a kind is
one new module, not an edit of every place that asks which kind a run uses.

A kind outside rlexp is named in config as `cluster.job: package.module:Class` (imported here, in the controller:
only the controller builds the job)."""
from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any, ClassVar

from rlexp.config.schema import ClusterConfig
from rlexp.registry import IMPORTED, PluginError, import_module


class JobBackend:
    """One kind of Monarch job. Class attributes are the kind's facts; methods take the run's `ClusterConfig`."""

    name: ClassVar[str] = ""
    monarch_job: ClassVar[str] = ""  # the Monarch job class it builds (what `job_spec` reports)
    own_hosts: ClassVar[bool] = True  # roles may get hosts of their own (`cluster.hosts_per_role`)
    one_machine: ClassVar[bool] = False  # every host is a process of the controller's machine (/dev/shm reaches all)
    local_devices: ClassVar[bool] = False  # the run's GPUs are this machine's: `rlexp plan` checks they exist here
    remote_rendezvous: ClassVar[bool] = False  # a trainer on hosts of its own finds its port on its rank-0 host

    @classmethod
    def kwargs(cls, c: ClusterConfig) -> dict[str, Any]:
        """Keyword arguments for the Monarch job, every value from the config (pure: checked without the job)."""
        return {}

    @classmethod
    def check(cls, c: ClusterConfig) -> None:
        """Raise ValueError for what this kind cannot provide, naming the key and the fix."""

    @classmethod
    def arm(cls, env: dict[str, str] | None) -> tuple[dict[str, str] | None, subprocess.Popen | None]:
        """Before the first host exists: the hosts' environment, and a process that must outlive them (a reaper)."""
        return env, None

    @classmethod
    def make(cls, meshes: dict[str, int], kw: dict[str, Any], env: dict[str, str] | None) -> Any:
        """The Monarch job (not yet applied) for `meshes` (hosts per role)."""
        raise NotImplementedError(f"cluster.job={cls.name} gives no roles hosts of their own")

    @classmethod
    def describe(cls, c: ClusterConfig) -> str:
        """How the placement printout names this job."""
        return f"{cls.name} job"


JOBS: dict[str, type[JobBackend]] = {}


def register_job(name: str) -> Callable[[type[JobBackend]], type[JobBackend]]:
    def deco(cls: type[JobBackend]) -> type[JobBackend]:
        cls.name = name
        JOBS[name] = cls
        return cls

    return deco


def job_backend(name: str) -> type[JobBackend]:
    """The backend `cluster.job=name` stands for; ValueError naming the choices for an unknown one."""
    name = str(name)
    if ":" in name:
        mod, _, attr = name.partition(":")
        try:  # the same import (and error: module, cause, sys.path) as every other plug-in (rlexp.registry)
            cls = getattr(import_module(mod, f"cluster.job={name}"), attr, None)
        except PluginError as e:
            raise ValueError(str(e)) from None
        if not (isinstance(cls, type) and issubclass(cls, JobBackend)) or JOBS.get(cls.name) is not cls:
            raise ValueError(f"cluster.job={name}: {mod} has no JobBackend subclass {attr!r} registered with "
                             f"@rlexp.cluster.registry.register_job")
        IMPORTED[mod] = None  # recorded in the manifest with its source hash, like every plug-in
        return cls
    cls = JOBS.get(name)
    if cls is None:
        raise ValueError(f"unknown cluster.job={name!r}; choose one of {', '.join(sorted(JOBS))}, or name a job "
                         f"module's class as package.module:Class")
    return cls
