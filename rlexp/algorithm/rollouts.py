"""Multi-turn episodes for the training loop: generate -> environment reply -> generate again.

    turn 0:   generators.generate(prompts, n=group_size)          # a GRPO group = episodes from one start
    repeat:   reply = env.step(sample, transcript, response)      # guarded: errors reach the model as text
              until every episode is done, has max_turns responses, or no room for another turn is left
              generators.generate(prompt + everything so far, n=1)
    finally:  generators.score(whole episodes)                    # titan: the trainer's logprobs, bit for bit

Episodes are kept as tokens, never re-encoded text: the trained sequence is exactly what the policy saw and
wrote, the environment's replies included, with `loss_mask` 0 on the replies (context, not actions; masked
out of the loss, the KL and the importance ratio in the trainer). Each turn's request carries its own seed,
`request_seed(replica seed, step, turn)` per slice (turn 0's is the single-turn seed), so what comes back does
not depend on which replica served it, and a resumed run regenerates the same episodes.

Logprobs: each turn returns the generator's logprobs of its tokens. With the titan backend, once the episodes
are complete they are scored again in one call on the whole sequences -- the batch the trainer will see -- so
generator and trainer logprobs agree bit for bit (`logprob_diff/max` = 0) as in the single-turn case. That
rescore is used only for episodes whose turns all came from the weights that rescored them; in `sync=async`
an episode's turns can span versions (the first turn is issued a step ahead, the later ones when the loop
collects it), so they keep their per-turn logprobs, and the episode's `policy_version` is its oldest turn's,
which is what the replay buffer judges staleness by.

Single-turn environments never come here: `rlexp.algorithm.loop.generate_groups` serves them unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlexp.config.schema import TrainConfig
from rlexp.core.seeding import request_seed
from rlexp.core.services import Pending, Services
from rlexp.envs.base import Environment
from rlexp.envs.guard import Encode, GuardedSteps, Reply
from rlexp.types import Completion, RewardOutput, Sample

POLICY, ENV, PROMPT = "policy", "environment", "prompt"


@dataclass
class _Episode:
    sample: Sample
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)  # everything after the prompt
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    segments: list[dict[str, str]] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str = "stop"
    open: bool = True
    tool_calls: int = 0
    env_errors: int = 0
    env_s: float = 0.0
    gen_s: float = 0.0
    turn_reward: float = 0.0

    def transcript(self) -> str:
        return "".join(s["text"] for s in self.segments)

    def add_turn(self, c: Completion) -> None:
        self.tokens += c.token_ids
        self.logprobs += c.logprobs[: len(c.token_ids)] + [0.0] * max(0, len(c.token_ids) - len(c.logprobs))
        self.mask += [1] * len(c.token_ids)
        self.segments.append({"role": POLICY, "text": c.text})
        self.versions.append(c.policy_version)
        self.finish = c.finish_reason
        self.gen_s += c.gen_s

    def add_reply(self, r: Reply) -> None:
        self.tokens += r.ids
        self.logprobs += [0.0] * len(r.ids)
        self.mask += [0] * len(r.ids)
        self.segments.append({"role": ENV, "text": r.text or ""})

    def completion(self) -> Completion:
        return Completion(prompt_ids=self.prompt_ids, token_ids=self.tokens, logprobs=self.logprobs,
                          text=self.transcript(), policy_version=min(self.versions), finish_reason=self.finish,
                          loss_mask=self.mask, segments=self.segments, turn_versions=self.versions,
                          tool_calls=self.tool_calls, tool_errors=self.env_errors, env_s=self.env_s,
                          gen_s=self.gen_s, turn_reward=self.turn_reward)


class MultiTurn:
    """Samples GRPO groups of multi-turn episodes through the generator service (see the module docstring)."""

    def __init__(self, env: Environment, encode: Encode, cfg: TrainConfig) -> None:
        self.env, self.encode, self.cfg = env, encode, cfg
        self.steps = GuardedSteps(env, encode)
        self.max_turns = int(env.cfg.max_turns)
        self.stop = list(env.stop) or None
        self.per_turn_reward = type(env).turn_reward is not Environment.turn_reward
        self.rescore = str(cfg.generator.backend) == "titan"

    def generate(self, svc: Services, samples: list[Sample], step: int) -> Pending[list[list[Completion]]]:
        """`group_size` episodes per sample, grouped; the first turn is requested now, the rest when collected."""
        a = self.cfg.algorithm
        prompts = [self.encode(s.problem.prompt) for s in samples]
        first = svc.generators.generate.scatter(
            prompts, a.group_size, a.max_tokens, a.temperature,
            per_shard=lambda i: (request_seed(svc.generator_seeds[i], step), self.stop))
        return first.then(lambda parts: self._finish(svc, samples, [c for p in parts for c in p], step))

    def _budget(self, ep: _Episode) -> int:
        """Response tokens this episode may still hold (its own and the environment's)."""
        cap = int(self.env.cfg.max_episode_tokens) or (int(self.cfg.model.arch.max_seq_len) - len(ep.prompt_ids))
        return cap - len(ep.tokens)

    def _finish(self, svc: Services, samples: list[Sample], first: list[Completion], step: int
                ) -> list[list[Completion]]:
        a = self.cfg.algorithm
        k = a.group_size
        eps = [_Episode(samples[i // k], c.prompt_ids) for i, c in enumerate(first)]
        for ep, c in zip(eps, first):
            self._after_turn(ep, c)
        turn = 1
        while True:
            # Another turn only when the policy has responses left and a whole turn fits after the reply.
            for ep in eps:
                ep.open = ep.open and len(ep.versions) < self.max_turns and self._budget(ep) > a.max_tokens
            stepping = [ep for ep in eps if ep.open]
            replies = self.steps([(ep.sample, "".join(s["text"] for s in ep.segments[:-1]), ep.segments[-1]["text"])
                                  for ep in stepping])
            for ep, r in zip(stepping, replies):
                ep.env_s += r.seconds
                ep.env_errors += r.error is not None
                if r.text is None or len(r.ids) + a.max_tokens > self._budget(ep):
                    ep.open = False
                    continue
                ep.add_reply(r)
                ep.tool_calls += self.env.replies_are_tool_calls
            active = [ep for ep in eps if ep.open]
            if not active:
                break
            parts = svc.generators.generate.scatter(
                [ep.prompt_ids + ep.tokens for ep in active], 1, a.max_tokens, a.temperature,
                per_shard=lambda i, t=turn: (request_seed(svc.generator_seeds[i], step, t), self.stop)).get()
            for ep, c in zip(active, [c for p in parts for c in p]):
                self._after_turn(ep, c)
            turn += 1
        if self.rescore:
            self._rescore(svc, eps)
        done = [ep.completion() for ep in eps]
        return [done[i:i + k] for i in range(0, len(done), k)]

    def _after_turn(self, ep: _Episode, c: Completion) -> None:
        prior = ep.transcript()
        ep.add_turn(c)
        if self.per_turn_reward:
            ep.turn_reward += float(self.env.turn_reward(ep.sample, prior, c.text))

    def _rescore(self, svc: Services, eps: list[_Episode]) -> None:
        """The policy tokens' logprobs from one forward over the whole episodes (the trainer's batch), for
        the episodes whose every turn the scoring weights sampled."""
        scored = svc.generators.score.route([ep.prompt_ids for ep in eps], [ep.tokens for ep in eps],
                                            self.cfg.algorithm.temperature).get()
        if scored is None:
            return
        rows, version = scored
        for ep, row in zip(eps, rows):
            if len(row) == len(ep.tokens) and all(v == version for v in ep.versions):
                ep.logprobs = [lp if m else 0.0 for lp, m in zip(row, ep.mask)]


def episode_rewards(flat: list[Completion], scored: RewardOutput) -> list[float]:
    """The scored (final) reward plus the episode's per-turn rewards."""
    return [r + c.turn_reward for r, c in zip(scored.rewards, flat)]


def episode_metrics(flat: list[Completion]) -> dict[str, float]:
    n = max(1, len(flat))
    return {"episode/turns_mean": sum(c.turns for c in flat) / n,
            "episode/tool_calls_mean": sum(c.tool_calls for c in flat) / n,
            "episode/env_errors": float(sum(c.tool_errors for c in flat)),
            "episode/policy_tokens_mean": sum(sum(c.loss_mask or ()) for c in flat) / n,
            "episode/env_tokens_mean": sum(len(c.token_ids) - sum(c.loss_mask or ()) for c in flat) / n,
            "time/env_s": sum(c.env_s for c in flat)}


def transcript_row(prompt: str, c: Completion) -> dict[str, Any]:
    """Rollout-table fields of a multi-turn episode: every segment with its role, and the number of turns."""
    return {"transcript": [{"role": PROMPT, "text": prompt}, *(c.segments or [])], "turns": c.turns,
            "turn_versions": list(c.turn_versions or [])}
