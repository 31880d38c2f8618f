"""`cluster.job=process`: simulated hosts, one local process group each (Monarch's ProcessJob), what the tests
use to rehearse several hosts on one machine.

A simulated host is a process that Monarch starts in a session of its own, so it outlives a controller killed
with `kill -9`: the job is marked and a reaper (rlexp/cluster/reaper.py) started before the first host exists,
which ends every process of the job once the controller is gone."""
from __future__ import annotations

import subprocess
from typing import Any

from rlexp.cluster import reaper
from rlexp.cluster.registry import JobBackend, register_job


@register_job("process")
class ProcessJob(JobBackend):
    monarch_job = "ProcessJob"
    one_machine = True

    @classmethod
    def arm(cls, env: dict[str, str] | None) -> tuple[dict[str, str] | None, subprocess.Popen | None]:
        reaper.clean_stale()
        owner = reaper.owner_id()
        return {**(env or {}), reaper.OWNER_ENV: owner}, reaper.start(owner)

    @classmethod
    def make(cls, meshes: dict[str, int], kw: dict[str, Any], env: dict[str, str] | None) -> Any:
        import monarch.job as mj

        return mj.ProcessJob(meshes, env=env)
