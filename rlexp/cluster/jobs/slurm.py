"""`cluster.job=slurm`: one Slurm allocation whose nodes are split among the roles, through
Monarch's SlurmJob as adapted in `rlexp.cluster.jobs.slurm_job`; every site value comes from
`cluster.slurm`.

No allocation outlives its run: a normal end, Ctrl-C and SIGTERM cancel it in teardown
(`Hosts.close`); for a controller killed with `kill -9`, a reaper started before `sbatch`
(rlexp/cluster/reaper.py) cancels every job that carries the controller's mark; and should the
controller's host die with its reaper, the job cancels itself once the controller's heartbeat file
goes stale (`cluster.slurm.heartbeat_timeout_s`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from rlexp.cluster import reaper
from rlexp.cluster.registry import JobBackend, register_job
from rlexp.config.schema import ClusterConfig


@register_job("slurm")
class SlurmJob(JobBackend):
    monarch_job = "SlurmJob"
    remote_rendezvous = True

    @classmethod
    def kwargs(cls, c: ClusterConfig) -> dict[str, Any]:
        s = c.slurm
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
            "gpus_per_node": c.gpus_per_host or None,
            "log_dir": s.log_dir,
            "heartbeat_timeout_s": s.heartbeat_timeout_s,
        }
        return {k: v for k, v in kw.items() if v is not None}  # unset values are Monarch's defaults

    @classmethod
    def check(cls, c: ClusterConfig) -> None:
        s = c.slurm
        if s.start_timeout_s is not None and s.start_timeout_s <= 0:
            raise ValueError(
                f"cluster.slurm.start_timeout_s={s.start_timeout_s}: give seconds > 0, or null to "
                f"wait as long as the job pends"
            )
        if s.heartbeat_timeout_s < 0 or 0 < s.heartbeat_timeout_s < 15:
            raise ValueError(
                f"cluster.slurm.heartbeat_timeout_s={s.heartbeat_timeout_s}: give 0 (no guard) or "
                f">= 15 s (the controller touches its heartbeat every 5 s)"
            )
        if not 1024 <= s.port <= 65000:
            raise ValueError(
                f"cluster.slurm.port={s.port}: give a port from 1024 to 65000 "
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
    def describe(cls, c: ClusterConfig) -> str:
        part = c.slurm.partition or "default"
        return f"Slurm job ({sum(c.role_hosts.values())} nodes, partition {part})"


def log_dir(given: str | None) -> str:
    """Where the job's stdout/stderr and heartbeat go: `cluster.slurm.log_dir`, else the run
    folder's `slurm/`
    (on the filesystem the nodes share, as a run folder on a cluster is)."""
    if given:
        return given
    from hydra.core.hydra_config import HydraConfig

    base = Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else Path.cwd()
    return str(base.resolve() / "slurm")
