"""Hosts for the actor graph: which Monarch job provides them, and which host each role's processes run on.

`cluster.job` picks the job: `local` (this host), `process` (simulated hosts: one local process group each,
what the tests use to rehearse several hosts), `slurm`, `kubernetes`. `cluster.hosts_per_role` gives a role
hosts of its own; its replicas or ranks are spread over them, and a role not listed runs on the controller's
host. One Monarch host mesh per role, named after the role, so a host's label (`generator_1`) is the name
the job gives it.

A simulated host is a process that Monarch starts in a session of its own, so it outlives a controller
killed with `kill -9`. `Hosts` therefore marks the job and starts a reaper (rlexp/reaper.py) before the
first host exists: it ends every process of the job once the controller is gone, so no run leaves
processes behind, whenever it is killed.
"""
from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from rlexp import reaper
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
    meshes = c.role_hosts
    if c.job == "local":
        return "LocalJob", {}, {}
    if not meshes:
        raise ValueError(f"cluster.job={c.job} needs cluster.hosts_per_role (hosts per role, e.g. "
                         f"cluster.hosts_per_role.generator=2 cluster.hosts_per_role.trainer=1)")
    if c.job == "process":
        return "ProcessJob", meshes, {}
    if c.job == "slurm":
        s = c.slurm
        kw: dict[str, Any] = {"python_exe": s.python_exe, "slurm_args": list(s.extra_args), "job_name": s.job_name,
                              "time_limit": s.time_limit, "partition": s.partition, "account": s.account,
                              "qos": s.qos, "cpus_per_task": s.cpus_per_task, "mem": s.mem,
                              "job_start_timeout": s.start_timeout_s,
                              "gpus_per_node": c.gpus_per_host or None}
        return "SlurmJob", meshes, {k: v for k, v in kw.items() if v is not None}
    k = c.kubernetes
    return "KubernetesJob", meshes, {"namespace": k.namespace, "timeout": k.timeout_s, "kubeconfig": k.kubeconfig,
                                     "image": k.image, "gpus_per_pod": k.gpus_per_pod or c.gpus_per_host,
                                     "shared_memory_size": k.shared_memory_size}


def check_cluster(c: ClusterConfig) -> None:
    """Raise ValueError now for a layout no job can provide, naming the key and the fix."""
    bad = {r: n for r, n in vars(c.hosts_per_role).items() if n < 0}
    if bad:
        raise ValueError(f"cluster.hosts_per_role: host counts must be >= 0, got {bad}")
    total = sum(c.role_hosts.values())
    if c.job == "local" and total > 0:
        raise ValueError(f"cluster.job=local has this one host, but cluster.hosts_per_role asks for {total}: use "
                         f"cluster=process to rehearse several hosts here, or cluster.job=slurm|kubernetes")
    if c.job != "local" and total and c.device == "cuda" and total != c.hosts:
        raise ValueError(f"cluster.hosts={c.hosts} but cluster.hosts_per_role adds up to {total} hosts "
                         f"({c.role_hosts}): set cluster.hosts={total} so `rlexp plan` counts them")
    if c.job == "kubernetes":
        try:
            import kubernetes  # noqa: F401
        except ImportError:
            raise ValueError("cluster.job=kubernetes needs the `kubernetes` Python package beside Monarch "
                             "(install it into this environment), or use cluster.job=slurm|process") from None
    job_spec(c)


def weight_hosts(c: ClusterConfig) -> int:
    """Machines the weights span from trainer to generators (1 = they share memory). Simulated hosts
    (`process`) are processes of this machine, so /dev/shm reaches all of them."""
    roles = c.role_hosts
    if c.job in ("local", "process") or not (roles.get("generator") or roles.get("trainer")):
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
        kind, meshes, kw = job_spec(c)
        if meshes:
            from monarch.config import configure

            # Attaching pushes config to every host; on a loaded machine (or a slow network) Monarch's 10 s
            # default for that barrier fails the start.
            configure(mesh_attach_config_timeout=ATTACH_TIMEOUT)
            if kind == "ProcessJob":  # armed before any host exists: a kill at any moment leaves nothing
                reaper.clean_stale()
                owner = reaper.owner_id()
                env = {**(env or {}), reaper.OWNER_ENV: owner}
                self._reaper = reaper.start(owner)
            try:
                self.job = _make_job(kind, meshes, kw, env)
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


def _make_job(kind: str, meshes: dict[str, int], kw: dict[str, Any], env: dict[str, str] | None) -> Any:
    import monarch.job as mj

    if kind == "ProcessJob":
        return mj.ProcessJob(meshes, env=env)
    if kind == "SlurmJob":
        return mj.SlurmJob(meshes, **kw)
    from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob

    job = KubernetesJob(namespace=kw["namespace"], timeout=kw["timeout"],
                        kubeconfig=KubeConfig.from_path(kw["kubeconfig"]) if kw["kubeconfig"] else None)
    resources = {"nvidia.com/gpu": kw["gpus_per_pod"]} if kw["gpus_per_pod"] else None
    for role, n in meshes.items():
        image = (ImageSpec(kw["image"], resources=resources, shared_memory_size=kw["shared_memory_size"])
                 if kw["image"] else None)
        job.add_mesh(role, n, image_spec=image)
    return job
