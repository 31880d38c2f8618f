"""Verifier services: each model verifier (a reward model or an LM judge) in processes of its own.

A verifier model is scaled, placed and batched apart from the policy and from the reward service that
combines the verifiers: `reward.verifiers[i].replicas` processes (one GPU each on CUDA), every one holding
the model once. The reward service scores through `served_scorer`, which splits a batch over the replicas.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from monarch.actor import Actor, current_rank, endpoint

from rlexp.actors.settings import VerifierSettings
from rlexp.core.gpu_mask import check_mask
from rlexp.core.plugins import activate_from_env
from rlexp.core.seeding import apply_process_determinism
from rlexp.core.services import Pending, Service
from rlexp.envs.registry import build_env
from rlexp.rewards.verifiers.registry import build_verifier
from rlexp.types import Problem


class VerifierService(Actor):
    def __init__(self, settings: VerifierSettings) -> None:
        activate_from_env()  # the user's plug-ins, before any name in the config is looked up
        # This replica's GPU (`gpus[rank]`, from rlexp.cluster.layout.assign_gpus) was masked when
        # its process was spawned, before torch, so a verifier never lands on the policy's GPUs.
        gpus = settings.gpus
        if settings.device == "cuda" and gpus:
            check_mask(gpus[current_rank().rank if len(gpus) > 1 else 0])
        apply_process_determinism()
        if settings.threads:
            torch.set_num_threads(settings.threads)
        self.vcfg, self.env_cfg, self.device = settings.verifier, settings.environment, settings.device

    @endpoint
    def setup(self) -> float:
        """Load the model; returns the seconds it took."""
        t = time.perf_counter()
        self.verifier = build_verifier(self.vcfg, build_env(self.env_cfg), served=False, device=self.device)
        return time.perf_counter() - t

    @endpoint
    def score(self, problems: list[Problem], texts: list[str]) -> list[float]:
        """Each distinct (prompt, response) is scored once: a group often repeats an answer, and a model's
        score depends on nothing else."""
        index: dict[tuple[str, str], int] = {}
        keys = [index.setdefault((p.prompt, t), len(index)) for p, t in zip(problems, texts)]
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        order = sorted(first.values())
        scores = self.verifier.score([problems[i] for i in order], [texts[i] for i in order])
        by_key = {keys[i]: float(x) for i, x in zip(order, scores)}
        return [by_key[k] for k in keys]


def served_scorer(name: str, replicas: list[Any]) -> tuple[Callable[[list[Problem], list[str]], Pending[list[float]]],
                                                          Service]:
    """What a reward service calls in place of a local model: the batch split over the verifier's replicas,
    returned without waiting; and the service, for its request accounting. A replica whose process dies is
    retired (its slices go to the others, same answers: a verifier model is deterministic)."""
    svc = Service(f"verifier_{name}", replicas,
                  log=lambda msg: print(f"[rlexp] {msg}", flush=True))

    def start(problems: list[Problem], texts: list[str]) -> Pending[list[float]]:
        return svc.score.scatter(problems, rows=[texts]).then(lambda parts: [x for part in parts for x in part])

    return start, svc
