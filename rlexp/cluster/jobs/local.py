"""`cluster.job=local`: this one host; every role runs beside the controller."""
from __future__ import annotations

from rlexp.cluster.registry import JobBackend, register_job
from rlexp.config.schema import ClusterConfig


@register_job("local")
class LocalJob(JobBackend):
    monarch_job = "LocalJob"
    own_hosts = False
    one_machine = True
    local_devices = True

    @classmethod
    def check(cls, c: ClusterConfig) -> None:
        total = sum(c.role_hosts.values())
        if total > 0:
            raise ValueError(f"cluster.job=local has this one host, but cluster.hosts_per_role asks for {total}: use "
                             f"cluster=process to rehearse several hosts here, or cluster.job=slurm|kubernetes")
