"""Which GPUs each role's processes get on a host: trainer ranks first, then each generator replica."""
from __future__ import annotations

from typing import Any


def assign_gpus(c: Any) -> dict[str, list[str]]:
    """CUDA_VISIBLE_DEVICES per role and rank on this host: the trainer's ranks (and the reference
    model beside them) take GPUs 0..W-1, then each generator replica takes `generator.gpus_per_replica`.
    Without it every process would open GPU 0. Empty on CPU. Fits are checked by `validate`."""
    if c.cluster.device != "cuda":
        return {}
    world, per_gen = c.model.parallelism.trainer_world, c.generator.gpus_per_replica
    out = {"trainer": [str(r) for r in range(world)]}
    for i in range(c.generator.replicas):
        first = world + i * per_gen
        out[f"generator{i}"] = [",".join(str(first + j) for j in range(per_gen))]
    return out


def gpus_needed(c: Any) -> int:
    return c.model.parallelism.trainer_world + c.generator.replicas * c.generator.gpus_per_replica
