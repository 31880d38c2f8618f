"""`cluster.job=kubernetes`: Monarch's KubernetesJob; with `cluster.job_options.image` it provisions
one MonarchMesh per role (needs the Monarch operator), without it attaches to pods already labelled
per mesh."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlexp.cluster.registry import JobBackend, register_job
from rlexp.config.schema import ClusterConfig
from rlexp.config.trust import DATA, ENDPOINT, RUNS


@dataclass
class KubernetesSettings:
    """`cluster.job_options` of `cluster.job=kubernetes`: Monarch's KubernetesJob; with `image` it
    provisions one MonarchMesh per role (needs the Monarch operator), without it attaches to pods
    already labelled per mesh."""

    # The namespace the meshes' pods run in.
    namespace: str = field(default="default", metadata=DATA)
    # Container image to provision one MonarchMesh per role; null: attach to labelled pods.
    image: str | None = field(default=None, metadata=RUNS)
    gpus_per_pod: int = 0  # resources: nvidia.com/gpu per pod (one pod is one host)
    # memory-backed /dev/shm per pod, e.g. "64Gi" (the shm transport)
    shared_memory_size: str | None = field(default=None, metadata=DATA)
    # out-of-cluster access; None: the in-cluster service account
    kubeconfig: str | None = field(default=None, metadata=ENDPOINT)
    timeout_s: int | None = None  # seconds to wait for each mesh's pods


@register_job("kubernetes")
class KubernetesJob(JobBackend):
    monarch_job = "KubernetesJob"
    remote_rendezvous = True
    Settings = KubernetesSettings

    @classmethod
    def kwargs(cls, cluster: ClusterConfig) -> dict[str, Any]:
        k = cls.settings(cluster)
        return {"namespace": k.namespace, "timeout": k.timeout_s, "kubeconfig": k.kubeconfig,
                "image": k.image, "gpus_per_pod": k.gpus_per_pod or cluster.gpus_per_host,
                "shared_memory_size": k.shared_memory_size}

    @classmethod
    def check(cls, cluster: ClusterConfig) -> None:
        try:
            import kubernetes  # noqa: F401  (the package, not this module: imports are absolute)
        except ImportError:
            raise ValueError("cluster.job=kubernetes needs the `kubernetes` Python package beside Monarch "
                             "(install it into this environment), or use cluster.job=slurm|process") from None

    @classmethod
    def make(cls, meshes: dict[str, int], kw: dict[str, Any], env: dict[str, str] | None) -> Any:
        from monarch.job import kubernetes as mk


        job = mk.KubernetesJob(namespace=kw["namespace"], timeout=kw["timeout"],
                                   kubeconfig=mk.KubeConfig.from_path(kw["kubeconfig"]) if kw["kubeconfig"] else None)
        resources = {"nvidia.com/gpu": kw["gpus_per_pod"]} if kw["gpus_per_pod"] else None
        for role, n in meshes.items():
            image = (mk.ImageSpec(kw["image"], resources=resources, shared_memory_size=kw["shared_memory_size"])
                     if kw["image"] else None)
            job.add_mesh(role, n, image_spec=image)
        return job
