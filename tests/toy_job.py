"""A whole job kind from outside rlexp, for tests/test_cluster.py: `local2`, the controller's one host, like `local`.
Adding a kind is this one module; a run names it as `cluster.job=tests.toy_job:LocalTwo`."""
from __future__ import annotations

from rlexp.cluster.registry import JobBackend, register_job


@register_job("local2")
class LocalTwo(JobBackend):
    monarch_job = "LocalJob"
    own_hosts = False
    one_machine = True
    local_devices = True
