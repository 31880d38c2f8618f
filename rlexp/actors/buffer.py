"""Replay buffer actor: holds scored episodes between rollout and training, enforces staleness."""
from __future__ import annotations

import random
from typing import Any

from monarch.actor import Actor, endpoint

from rlexp.actors.settings import BufferSettings
from rlexp.types import Episode


class ReplayBuffer(Actor):
    """FIFO of groups; `sample` drops groups older than `max_policy_age` versions and counts them.

    Sampling is whole groups in arrival order, so every prompt's group trains together (GRPO's
    advantages are relative within a group); the seeded RNG only shuffles episodes inside the batch.
    """

    def __init__(self, settings: BufferSettings) -> None:
        self.rng = random.Random(settings.seed)
        self.max_age = settings.max_policy_age
        self.groups: list[list[Episode]] = []
        self.dropped = 0

    @endpoint
    async def add(self, groups: list[list[Episode]]) -> int:
        self.groups.extend(groups)
        return len(self.groups)

    @endpoint
    async def sample(self, current_version: int, n_groups: int) -> tuple[list[Episode], dict[str, float]] | None:
        # Judged by the oldest episode of a group (a multi-turn episode's version is its oldest turn's).
        fresh = [g for g in self.groups if current_version - min(e.policy_version for e in g) <= self.max_age]
        stale = len(self.groups) - len(fresh)
        self.dropped += stale
        self.groups = fresh
        if len(self.groups) < n_groups:
            return None
        batch_groups, self.groups = self.groups[:n_groups], self.groups[n_groups:]
        episodes = [e for g in batch_groups for e in g]
        self.rng.shuffle(episodes)
        ages = [current_version - e.policy_version for e in episodes]
        metrics = {"policy_age/mean": sum(ages) / len(ages), "policy_age/max": float(max(ages))}
        if self.max_age or self.dropped or self.groups:
            metrics.update(self._counters(stale))
        return episodes, metrics

    def _counters(self, stale: int) -> dict[str, float]:
        """The buffer's counters, reported on a step where they can say something: always when
        groups may age (`max_policy_age` > 0, async), on-policy only once a group came back stale
        or is left waiting (after a fault). A healthy on-policy run has them at 0 on every step:
        logged, those constant series were the first charts of its MLflow run page (sorted by
        name, `buffer/` first)."""
        return {"buffer/dropped_stale": float(stale), "buffer/dropped_total": float(self.dropped),
                "buffer/size": float(len(self.groups))}

    @endpoint
    async def state_dict(self) -> dict[str, Any]:
        """Plain values only, so the checkpoint loads without unpickling code."""
        return {"rng": self.rng.getstate(), "groups": [[e.to_plain() for e in g] for g in self.groups],
                "dropped": self.dropped}

    @endpoint
    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self.groups = [[Episode.from_plain(e) for e in g] for g in state["groups"]]
        self.dropped = state["dropped"]
