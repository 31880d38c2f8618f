"""`cluster.job=slurm`: Monarch's SlurmJob, one allocation whose nodes are split among the roles; every site
value comes from `cluster.slurm`."""
from __future__ import annotations

from typing import Any

from rlexp.cluster.registry import JobBackend, register_job
from rlexp.config.schema import ClusterConfig


@register_job("slurm")
class SlurmJob(JobBackend):
    monarch_job = "SlurmJob"
    remote_rendezvous = True

    @classmethod
    def kwargs(cls, c: ClusterConfig) -> dict[str, Any]:
        s = c.slurm
        kw: dict[str, Any] = {"python_exe": s.python_exe, "slurm_args": list(s.extra_args), "job_name": s.job_name,
                              "time_limit": s.time_limit, "partition": s.partition, "account": s.account,
                              "qos": s.qos, "cpus_per_task": s.cpus_per_task, "mem": s.mem,
                              "job_start_timeout": s.start_timeout_s,
                              "gpus_per_node": c.gpus_per_host or None}
        return {k: v for k, v in kw.items() if v is not None}  # unset values are Monarch's defaults

    @classmethod
    def make(cls, meshes: dict[str, int], kw: dict[str, Any], env: dict[str, str] | None) -> Any:
        import monarch.job as mj

        return mj.SlurmJob(meshes, **kw)
