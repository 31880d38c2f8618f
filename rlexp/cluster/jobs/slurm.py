"""`cluster.job=slurm`: one Slurm allocation whose nodes are split among the roles, through
Monarch's SlurmJob as adapted in `rlexp.cluster.jobs.slurm_job`; every site value comes from
`cluster.job_options` (`SlurmSettings`).

No allocation outlives its run: a normal end, Ctrl-C and SIGTERM cancel it in teardown
(`Hosts.close`); for a controller killed with `kill -9`, a reaper started before `sbatch`
(rlexp/cluster/reaper.py) cancels every job that carries the controller's mark; and should the
controller's host die with its reaper, the job cancels itself once the controller's heartbeat file
goes stale (`cluster.job_options.heartbeat_timeout_s`)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlexp.cluster import reaper
from rlexp.cluster.registry import JobBackend, register_job
from rlexp.config.schema import ClusterConfig
from rlexp.config.trust import DATA, LOCATION, RUNS


@dataclass
class SlurmSettings:
    """`cluster.job_options` of `cluster.job=slurm`: Monarch's SlurmJob submits one allocation whose
    nodes are split among the roles (`cluster.hosts_per_role`). Nothing site-specific is built in:
    every value here is the site's to set. Each field's trust metadata is honoured in a manifest's
    overrides by the name rules of `rlexp.config.trust.option_kind`."""

    # sbatch --partition; null: the cluster's default.
    partition: str | None = field(default=None, metadata=DATA)
    # sbatch --account; null: the user's default.
    account: str | None = field(default=None, metadata=DATA)
    # sbatch --qos; null: the default.
    qos: str | None = field(default=None, metadata=DATA)
    # sbatch --time: finite by default, so no allocation runs on unnoticed; null: the partition's
    time_limit: str | None = field(default="04:00:00", metadata=DATA)
    # sbatch --cpus-per-task; null: Slurm's default.
    cpus_per_task: int | None = None
    mem: str | None = field(default=None, metadata=DATA)  # sbatch --mem, e.g. "512G"
    # sbatch --job-name.
    job_name: str = field(default="rlexp", metadata=DATA)
    # The interpreter on the nodes (an environment with rlexp installed); null: the one running this
    # command (`sys.executable`), its environment (PYTHONPATH, the venv) carried by --export=ALL.
    python_exe: str | None = field(default=None, metadata=RUNS)
    # further sbatch arguments, verbatim
    extra_args: list[str] = field(default_factory=list, metadata=RUNS)
    # Give up (and cancel the job) if the allocation has not started by then; null: wait forever.
    start_timeout_s: int | None = 1800
    port: int = 22222  # node i's Monarch worker listens on port + i (nodes may share one host)
    # The job cancels itself once the controller's heartbeat file (in the run folder) has not
    # changed for this long: the controller's host died with its reaper
    # (rlexp/cluster/jobs/slurm_worker.py). 0: no guard.
    heartbeat_timeout_s: int = 120
    # the job's stdout/stderr and heartbeat; null: <run dir>/slurm
    log_dir: str | None = field(default=None, metadata=LOCATION)


@register_job("slurm")
class SlurmJob(JobBackend):
    monarch_job = "SlurmJob"
    remote_rendezvous = True
    Settings = SlurmSettings

    @classmethod
    def kwargs(cls, cluster: ClusterConfig) -> dict[str, Any]:
        s = cls.settings(cluster)
        kw: dict[str, Any] = {
            "python_exe": s.python_exe or sys.executable,
            "slurm_args": list(s.extra_args),
            "job_name": s.job_name,
            "time_limit": s.time_limit,
            "partition": s.partition,
            "account": s.account,
            "qos": s.qos,
            "cpus_per_task": s.cpus_per_task,
            "mem": s.mem,
            "job_start_timeout": s.start_timeout_s,
            "monarch_port": s.port,
            "gpus_per_node": cluster.gpus_per_host or None,
            "log_dir": s.log_dir,
            "heartbeat_timeout_s": s.heartbeat_timeout_s,
        }
        return {k: v for k, v in kw.items() if v is not None}  # unset values are Monarch's defaults

    @classmethod
    def check(cls, cluster: ClusterConfig) -> None:
        s = cls.settings(cluster)
        if s.start_timeout_s is not None and s.start_timeout_s <= 0:
            raise ValueError(
                f"cluster.job_options.start_timeout_s={s.start_timeout_s}: give seconds > 0, or "
                f"null to wait as long as the job pends"
            )
        if s.heartbeat_timeout_s < 0 or 0 < s.heartbeat_timeout_s < 15:
            raise ValueError(
                f"cluster.job_options.heartbeat_timeout_s={s.heartbeat_timeout_s}: give 0 (no "
                f"guard) or >= 15 s (the controller touches its heartbeat every 5 s)"
            )
        if not 1024 <= s.port <= 65000:
            raise ValueError(
                f"cluster.job_options.port={s.port}: give a port from 1024 to 65000 "
                "(node i uses port + i)"
            )

    @classmethod
    def arm(
        cls, env: dict[str, str] | None
    ) -> tuple[dict[str, str] | None, subprocess.Popen | None]:
        reaper.cancel_stale_slurm_jobs()
        return env, reaper.start(reaper.owner_id(), slurm=True)

    @classmethod
    def make(cls, meshes: dict[str, int], kw: dict[str, Any], env: dict[str, str] | None) -> Any:
        from rlexp.cluster.jobs.slurm_job import RlexpSlurmJob

        return RlexpSlurmJob(
            meshes,
            **{**kw, "log_dir": log_dir(kw.get("log_dir"))},
            comment=reaper.slurm_mark(reaper.owner_id()),
        )

    @classmethod
    def describe(cls, cluster: ClusterConfig) -> str:
        part = cls.settings(cluster).partition or "default"
        return f"Slurm job ({sum(cluster.role_hosts.values())} nodes, partition {part})"


def log_dir(given: str | None) -> str:
    """Where the job's stdout/stderr and heartbeat go: `cluster.job_options.log_dir`, else the run
    folder's `slurm/`
    (on the filesystem the nodes share, as a run folder on a cluster is)."""
    if given:
        return given
    from hydra.core.hydra_config import HydraConfig

    base = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()
    return str(base.resolve() / "slurm")
