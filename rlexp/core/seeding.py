"""One run seed -> a distinct, recorded seed per component.

Derived by hashing (seed, component name) rather than seed+offset so that adding a component or a
replica never shifts the seeds of the others, and two components never share a stream by accident.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any

COMPONENTS = ("data", "trainer", "buffer")


def derive_seed(seed: int, component: str) -> int:
    digest = hashlib.sha256(f"rlexp:{seed}:{component}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def component_seeds(seed: int, generator_replicas: int) -> dict[str, int]:
    names = list(COMPONENTS) + [f"generator/{i}" for i in range(generator_replicas)]
    return {name: derive_seed(seed, name) for name in names}


def request_seed(replica_seed: int, step: int, call: int = 0) -> int:
    """Per-request sampling seed: reproducible whatever the routing, and across resume."""
    return derive_seed(replica_seed, f"step{step}/call{call}")


DETERMINISM_ENV = "RLEXP_DETERMINISM"


def apply_process_determinism() -> dict[str, Any]:
    """Apply `determinism` (off | seeded | full) in this process; every actor calls it at start.

    seeded: no TF32, no cuDNN autotuning (results depend only on seeds and inputs for a fixed layout).
    full: also `torch.use_deterministic_algorithms(True)` (errors on ops without a deterministic kernel).
    On CPU the default run is bit-for-bit reproducible under `seeded` (tested by `rlexp reproduce`).
    """
    import torch

    mode = os.environ.get(DETERMINISM_ENV, "seeded")
    flags: dict[str, Any] = {"mode": mode}
    if mode in ("seeded", "full"):
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        flags.update(cudnn_benchmark=False, tf32=False)
    if mode == "full":
        torch.use_deterministic_algorithms(True)
        flags.update(deterministic_algorithms=True, CUBLAS_WORKSPACE_CONFIG=os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    return flags
