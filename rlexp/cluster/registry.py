"""Job kinds (`cluster.job`) as registered backends: each kind is one module under rlexp/cluster/jobs/ that says
what it needs (the Monarch job it builds, its checks, whether its hosts share the controller's machine, whether
the trainer's rendezvous port must be found on a remote host, how placement describes it), so adding a kind is
one new module, not an edit of every place that asks which kind a run uses.

A kind outside rlexp is named in config as `cluster.job: package.module:Class` (imported here, in the controller:
only the controller builds the job)."""
from __future__ import annotations

import subprocess
from typing import Any, ClassVar

from rlexp.config.schema import ClusterConfig
from rlexp.config.validate import check_options
from rlexp.registry import Registry


class JobBackend:
    """One kind of Monarch job. Class attributes are the kind's facts; methods take the run's `ClusterConfig`."""

    name: ClassVar[str] = ""
    monarch_job: ClassVar[str] = ""  # the Monarch job class it builds (what `job_spec` reports)
    own_hosts: ClassVar[bool] = True  # roles may get hosts of their own (`cluster.hosts_per_role`)
    one_machine: ClassVar[bool] = False  # every host is a process of the controller's machine (/dev/shm reaches all)
    local_devices: ClassVar[bool] = False  # the run's GPUs are this machine's: `rlexp plan` checks they exist here
    remote_rendezvous: ClassVar[bool] = False  # a trainer on hosts of its own finds its port on its rank-0 host
    # The backend's own settings: a dataclass filled from `cluster.job_options` (typed, unknown keys
    # refused), the built-ins' (slurm's `SlurmSettings`) as a user's. None: it takes none.
    Settings: ClassVar[type | None] = None

    @classmethod
    def settings(cls, cluster: ClusterConfig) -> Any:
        """`cluster.job_options` as this backend's `Settings` (None when it declares none and none
        are given)."""
        options = dict(getattr(cluster, "job_options", None) or {})
        if cls.Settings is None:
            if options:
                raise ValueError(f"cluster.job_options={options}: cluster.job={cls.name} takes no "
                                 f"options; "
                                 f"remove them")
            return None
        return check_options(cls.Settings, options, f"cluster.job_options (cluster.job={cls.name})")

    @classmethod
    def kwargs(cls, cluster: ClusterConfig) -> dict[str, Any]:
        """Keyword arguments for the Monarch job, every value from the config (pure: checked without the job)."""
        return {}

    @classmethod
    def check(cls, cluster: ClusterConfig) -> None:
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
    def describe(cls, cluster: ClusterConfig) -> str:
        """How the placement printout names this job."""
        return f"{cls.name} job"


JOBS: Registry[type[JobBackend]] = Registry(
    "cluster.job", JobBackend,
    "a JobBackend subclass registered with @rlexp.cluster.registry.register_job",
    registered_only=True)
register_job = JOBS.register


def job_settings() -> list[tuple[str, str, type]]:
    """Each registered backend's `Settings`, for the config reference
    (`rlexp.config.reference.Extra`): (group shown, key prefix, dataclass), by name."""
    return [(f"cluster.job_options (cluster.job={name})", "cluster.job_options.", cls.Settings)
            for name, cls in sorted(JOBS.items()) if cls.Settings is not None]


def job_backend(name: str) -> type[JobBackend]:
    """The backend `cluster.job=name` stands for: a registered name or `package.module:Class`; an
    unknown one is a `PluginError` (a ValueError) naming the close matches and the choices."""
    return JOBS.get(str(name))
