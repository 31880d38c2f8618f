"""Reward service actor: combines verifiers in processes of its own, apart from the generators.

Model verifiers are not loaded here: each has a verifier service of its own (rlexp.actors.verifier), and
the launcher attaches them after spawn (`attach_verifiers`). An LM judge that is the policy itself
(`lm_judge` with `options.policy=true`) asks the policy's generators (`attach_judges`).
"""
from __future__ import annotations

from typing import Any

from monarch.actor import Actor, endpoint

from rlexp.actors.settings import RewardSettings
from rlexp.actors.verifier import served_scorer
from rlexp.core.plugins import activate_from_env
from rlexp.core.services import Service, is_process_failure
from rlexp.envs.registry import build_env
from rlexp.errors import UserCodeError
from rlexp.models.tokenizer import load_tokenizer
from rlexp.rewards.registry import build_reward
from rlexp.rewards.verifiers.base import ServedVerifier
from rlexp.rewards.verifiers.lm_judge import LMJudgeVerifier
from rlexp.types import RewardOutput, Sample


class RewardService(Actor):
    def __init__(self, settings: RewardSettings) -> None:
        activate_from_env()  # the user's plug-ins, before any name in the config is looked up
        self.cfg = settings.reward
        self.env = build_env(settings.environment)
        self.reward = build_reward(settings.reward, self.env)
        self.services: list[Service] = []  # the served verifiers', for their request accounting

    # Synchronous endpoints: a verifier call waits on another actor's reply, which an event-loop endpoint must not.
    @endpoint
    def attach_verifiers(self, services: dict[str, list[Any]]) -> list[str]:
        """Score each served model verifier through its service (`services`: name -> replica handles)."""
        attached = []
        for v in self.reward.verifiers:
            if isinstance(v, ServedVerifier):
                if v.name not in services:
                    raise RuntimeError(f"verifier {v.name!r} has no service; the launcher spawned {sorted(services)}")
                scorer, svc = served_scorer(v.name, services[v.name])
                v.attach(scorer)
                self.services.append(svc)
                attached.append(v.name)
        return attached

    @endpoint
    def attach_judges(self, generators: list[Any], model_dir: str) -> list[str]:
        """Serve every policy judge with the policy's tokenizer and its generators (Generator
        actor handles, the one to ask first at the head). A generator whose process died is
        passed over for the next: all hold the same weights, so the answer is the same. The
        launcher attaches live ones again once the generators' service has replaced or retired
        it (`Recovery.generators_changed`)."""
        judges = [v for v in self.reward.verifiers if isinstance(v, LMJudgeVerifier) and v.opts.policy]
        if not judges:
            return []
        tok = load_tokenizer(model_dir)
        live = list(generators)

        def next_logprobs(prompt_ids: list[list[int]], token_ids: list[int]) -> list[list[float]]:
            while True:
                try:
                    return live[0].next_token_logprobs.call_one(prompt_ids, token_ids).get()
                except Exception as e:
                    if not is_process_failure(e) or len(live) == 1:
                        raise
                    live.pop(0)

        for v in judges:
            v.attach(next_logprobs, tok)
        return [v.name for v in judges]

    @endpoint
    def score(self, samples: list[Sample], texts: list[str], group_size: int
              ) -> RewardOutput | UserCodeError:
        """A `UserCodeError` (the user's `check()` raised) is returned, not raised: the controller
        raises it as is, one clear line, where a raised one would arrive wrapped in a traceback."""
        try:
            out = self.reward.score(samples, texts, group_size)
        except UserCodeError as e:
            return UserCodeError(str(e))
        for svc in self.services:
            out.metrics.update(svc.metrics())
        return out

    @endpoint
    def state_dict(self) -> dict[str, Any]:
        return self.reward.state_dict()

    @endpoint
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reward.load_state_dict(state)

