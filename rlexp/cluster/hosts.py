"""Hosts for the actor graph: which Monarch job provides them, and which host each role's processes run on.

`cluster.job` picks the job kind, a registered backend (rlexp/cluster/registry.py; the built-in ones under
rlexp/cluster/jobs/): `local` (this host), `process` (simulated hosts: one local process group each, what the
tests use to rehearse several hosts), `slurm`, `kubernetes`. `cluster.hosts_per_role` gives a role hosts of its
own; its replicas or ranks are spread over them, and a role not listed runs on the controller's host. One
Monarch host mesh per role, named after the role, so a host's label (`generator_1`) is the name the job gives it.

A kind may need a process armed before the first host exists (`JobBackend.arm`): the process job starts a reaper
(rlexp/cluster/reaper.py) there, so no run leaves processes behind, whenever it is killed.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from rlexp.cluster.registry import job_backend
from rlexp.config.schema import ClusterConfig, HostsPerRole

ROLES = tuple(vars(HostsPerRole()))

LOCAL = "local"
ATTACH_TIMEOUT = "120s"


@dataclass(frozen=True)
class Host:
    label: str  # the job's name for it: "local", or "<role>_<i>"
    mesh: Any  # a Monarch HostMesh of this one host


def job_spec(c: ClusterConfig) -> tuple[str, dict[str, int], dict[str, Any]]:
    """(Monarch job class, hosts per mesh, keyword arguments) for `c`: every value comes from the config.
    Pure, so a Slurm or Kubernetes layout is checked (and tested) on a machine that has neither."""
    backend = job_backend(c.job)
    if not backend.own_hosts:
        return backend.monarch_job, {}, {}
    meshes = c.role_hosts
    if not meshes:
        raise ValueError(f"cluster.job={c.job} needs cluster.hosts_per_role (hosts per role, e.g. "
                         f"cluster.hosts_per_role.generator=2 cluster.hosts_per_role.trainer=1)")
    return backend.monarch_job, meshes, backend.kwargs(c)


def check_cluster(c: ClusterConfig) -> None:
    """Raise ValueError now for a layout no job can provide, naming the key and the fix."""
    bad = {r: n for r, n in vars(c.hosts_per_role).items() if n < 0}
    if bad:
        raise ValueError(f"cluster.hosts_per_role: host counts must be >= 0, got {bad}")
    backend = job_backend(c.job)
    total = sum(c.role_hosts.values())
    if backend.own_hosts and total and c.device == "cuda" and total != c.hosts:
        raise ValueError(f"cluster.hosts={c.hosts} but cluster.hosts_per_role adds up to {total} hosts "
                         f"({c.role_hosts}): set cluster.hosts={total} so `rlexp plan` counts them")
    backend.settings(c)  # its typed settings: an unknown or mistyped option stops here
    backend.check(c)
    job_spec(c)


def weight_hosts(c: ClusterConfig) -> int:
    """Machines the weights span from trainer to generators (1 = they share memory). Simulated hosts
    (`process`) are processes of this machine, so /dev/shm reaches all of them."""
    roles = c.role_hosts
    if job_backend(c.job).one_machine or not (roles.get("generator") or roles.get("trainer")):
        return 1
    return 1 + int(roles.get("generator", 0))


class Hosts:
    """The job's hosts by role, opened once per run; `close` ends the job and everything on it."""

    def __init__(self, c: ClusterConfig, env: dict[str, str] | None = None) -> None:
        from monarch.actor import this_host

        self.cfg = c
        self.job: Any = None
        self._reaper: subprocess.Popen | None = None
        self.roles: dict[str, list[Host]] = {}
        self._whole: dict[str, Host] = {}
        local = [Host(LOCAL, this_host())]
        backend = job_backend(c.job)
        _, meshes, kw = job_spec(c)
        if meshes:
            from monarch.config import configure

            # Attaching pushes config to every host; on a loaded machine (or a slow network) Monarch's 10 s
            # default for that barrier fails the start.
            configure(mesh_attach_config_timeout=ATTACH_TIMEOUT)
            env, self._reaper = backend.arm(env)  # before any host exists: a kill at any moment leaves nothing
            try:
                self.job = backend.make(meshes, kw, env)
                self.job.apply()
                state = self.job.state(cached_path=None)
                for role, n in meshes.items():
                    mesh = getattr(state, role)
                    self.roles[role] = [Host(f"{role}_{i}", mesh.slice(hosts=i)) for i in range(n)]
                    self._whole[role] = Host(self.roles[role][0].label if n == 1 else f"{role}_0..{n - 1}", mesh)
            except BaseException:  # Ctrl-C or a failed attach half-way: the caller never gets `self` to close
                self.close()
                raise
        for role in ROLES:
            self.roles.setdefault(role, local)

    def host(self, role: str, i: int = 0) -> Host:
        """Where replica (or host-block) `i` of `role` runs: round robin over the role's hosts."""
        hosts = self.roles[role]
        return hosts[i % len(hosts)]

    def whole(self, role: str) -> Host:
        """All of the role's hosts as one mesh (a trainer whose ranks span hosts)."""
        return self._whole.get(role, self.roles[role][0])

    def close(self) -> None:
        if self.job is not None:
            try:
                self.job.kill()
            except Exception as e:  # teardown goes on: the reaper below ends whatever is left
                print(f"[rlexp] stopping the {self.cfg.job} job: {e}", file=sys.stderr)
            self.job = None
        if self._reaper is not None:
            self._reaper.send_signal(signal.SIGUSR1)  # reap now, then exit
            try:
                self._reaper.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
            self._reaper = None
