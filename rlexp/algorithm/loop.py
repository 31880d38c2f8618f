"""The GRPO loop. Read this file first: it is the whole algorithm, written against a few services.

    for each step:
        samples      = environment.sample_batch(prompts_per_step)           # seeded data order
        groups       = generators.generate(prompts, n=group_size)           # vLLM or TorchTitan replicas
                       (multi-turn environments: episodes of turns and replies, rlexp/algorithm/rollouts.py)
        rewards      = rewards.score(samples, groups)                       # verifier replicas (rule, RM, Weaver)
        advantages   = group_normalise(rewards)                             # GRPO
        buffer.add(groups); batch = buffer.sample(current_version)          # drops samples that are too stale
        metrics      = trainer.train_step(batch)                            # clipped surrogate vs generator logprobs
        generators.update_weights(trainer.push_weights(version + 1))        # weight sync, queued behind the step

`sync.mode=on_policy` runs these in order. `sync.mode=async` keeps up to `sync.max_policy_age` rollouts
in flight while the trainer works, so generation and training overlap; what arrives too stale is dropped
(and counted). Message order to each actor is fixed, so both modes are deterministic for a given seed.
Which replica serves what is the services' business (rlexp/core/services.py), not the algorithm's.
"""
from __future__ import annotations

import functools
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlexp.algorithm.grpo import group_advantages
from rlexp.algorithm.rollouts import MultiTurn, episode_metrics, episode_rewards, transcript_row
from rlexp.config.schema import TrainConfig
from rlexp.core.seeding import request_seed
from rlexp.core.services import Pending, Services
from rlexp.envs.base import Environment
from rlexp.errors import UserCodeError
from rlexp.rewards.base import reward_class
from rlexp.rewards.crossing import bad_rewards, refuse
from rlexp.types import Completion, Episode, RewardOutput, Sample, TrainBatch

Encode = Callable[[str], list[int]]
OnStep = Callable[[int, dict[str, float], list[dict[str, Any]]], None]


@dataclass
class LoopState:
    """Everything the controller needs to resume exactly (saved in every checkpoint)."""

    step: int = 0
    version: int = 0
    data_rng: random.Random = field(default_factory=random.Random)
    samples_seen: int = 0
    # Async mode: prompts already drawn for rollouts still in flight, as (step, samples). Saved so that a
    # resume regenerates them instead of silently skipping that data.
    pending: list[tuple[int, list[Sample]]] = field(default_factory=list)

    def to_state(self) -> dict[str, Any]:
        """Plain values only (ints, lists, the rng's tuple): checkpoints are loaded with `weights_only`."""
        return {"step": self.step, "version": self.version, "data_rng": self.data_rng.getstate(),
                "samples_seen": self.samples_seen,
                "pending": [(s, [x.to_plain() for x in samples]) for s, samples in self.pending]}

    def load_state(self, state: dict[str, Any]) -> None:
        """In place: the controller's callbacks hold this object, so a resume must not swap it for another."""
        self.step, self.version, self.samples_seen = state["step"], state["version"], state["samples_seen"]
        self.data_rng.setstate(state["data_rng"])
        self.pending = [(s, [Sample.from_plain(x) for x in samples]) for s, samples in state.get("pending", [])]

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LoopState:
        restored = cls()
        restored.load_state(state)
        return restored


def generate_groups(svc: Services, samples: list[Sample], encode: Encode, cfg: TrainConfig, step: int
                    ) -> Pending[list[list[Completion]]]:
    """`group_size` responses per prompt. Each slice of prompts carries its own seed, derived from the
    step, so what comes back does not depend on which replica served it."""
    a = cfg.algorithm
    prompts = [encode(s.problem.prompt) for s in samples]
    shards = svc.generators.generate.scatter(
        prompts, a.group_size, a.max_tokens, a.temperature,
        per_shard=lambda i: (request_seed(svc.generator_seeds[i], step),))
    return shards.then(lambda parts: _groups([c for part in parts for c in part], a.group_size))


def _groups(flat: list[Any], k: int) -> list[list[Any]]:
    return [flat[i:i + k] for i in range(0, len(flat), k)]


def score_groups(svc: Services, samples: list[Sample], groups: list[list[Completion]], cfg: TrainConfig
                 ) -> tuple[list[list[Episode]], dict[str, float], list[dict[str, Any]]]:
    """Rewards, advantages and (optional) reference logprobs for every response, as episodes per group.
    Also returns a few scored rollouts, for the trackers' rollout tables."""
    a = cfg.algorithm
    k = a.group_size
    flat_samples = [s for s in samples for _ in range(k)]
    flat = [c for g in groups for c in g]
    # Whole groups per reward replica: Weaver's label model and group metrics need complete groups.
    parts = svc.rewards.score.scatter(flat_samples, k, unit=k, rows=[[c.text for c in flat]]).get()
    for part in parts:
        if isinstance(part, UserCodeError):  # the user's check() raised, in the reward's process
            raise part
    scored = RewardOutput.concat(parts)
    multi_turn = any(c.loss_mask is not None for c in flat)  # text = transcript; + per-turn rewards
    values = episode_rewards(flat, scored) if multi_turn else list(scored.rewards)
    dropped = check_rewards(values, flat_samples, [c.text for c in flat], cfg,
                            _value_range(cfg.reward.name), k)
    rewards = torch.tensor(values, dtype=torch.float32)
    adv = group_advantages(rewards, k, a.norm_adv_by_std)
    ref = None
    if svc.reference is not None:
        ref = svc.reference.logprobs.call([c.prompt_ids for c in flat], [c.token_ids for c in flat], a.temperature)
    adv_list, reward_list = adv.tolist(), rewards.tolist()  # one conversion each, not a tensor index per row
    episodes = [Episode(c.prompt_ids, c.token_ids, c.logprobs, adv_list[i], reward_list[i], c.policy_version,
                        ref[i] if ref else None, c.loss_mask) for i, c in enumerate(flat)]
    grouped = _groups(episodes, k)
    if dropped:  # out of training; the rest of its group was normalised with it at the group's mean
        grouped = [[e for j, e in enumerate(g) if gi * k + j not in dropped]
                   for gi, g in enumerate(grouped)]
        grouped = [g for g in grouped if g]
    if a.filter_zero_adv_groups:
        grouped = [g for g in grouped if any(e.advantage != 0.0 for e in g)] or grouped
    metrics = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
               "reward/zero_adv_groups": float(sum(all(e.advantage == 0.0 for e in g) for g in grouped)) / len(grouped),
               "response/len_mean": sum(len(c.token_ids) for c in flat) / len(flat),
               "reward/dropped_nonfinite": float(len(dropped))}
    metrics.update(scored.metrics)
    if multi_turn:
        metrics.update(episode_metrics(flat))
    shown = min(len(flat), cfg.logger.rollout_samples)
    rollouts = [{"prompt": flat_samples[i].problem.prompt, "response": flat[i].text, "reward": reward_list[i],
                 "advantage": adv_list[i], "policy_version": flat[i].policy_version,
                 **(scored.details[i] if i < len(scored.details) else {}),
                 **(transcript_row(flat_samples[i].problem.prompt, flat[i]) if multi_turn else {})}
                for i in range(shown)]
    return grouped, metrics, rollouts


@functools.cache
def _value_range(reward: str) -> tuple[float, float] | None:
    """The configured reward's declared range (`rlexp.rewards.base.Reward.value_range`), once."""
    return reward_class(reward).value_range


def check_rewards(values: list[float], samples: list[Sample], texts: list[str], cfg: TrainConfig,
                  value_range: tuple[float, float] | None, k: int) -> set[int]:
    """Every reward finite and in the reward's declared range, checked as it reaches the loop (a NaN
    would otherwise surface a step later in the sampler, naming nothing). `nonfinite_reward=stop`
    raises naming the reward, the sample, the response and the value; `drop` puts each bad reward at
    its group's mean of the good ones (the others' advantages ignore it) and returns the indices to
    drop."""
    bad = bad_rewards(values, value_range)
    if not bad:
        return set()
    if cfg.algorithm.nonfinite_reward == "stop":
        i = bad[0]
        raise refuse(cfg.reward.name, samples[i], texts[i], values[i], value_range, len(bad))
    dropped = set(bad)
    for g in range(0, len(values), k):
        good = [values[i] for i in range(g, g + k) if i not in dropped]
        mean = sum(good) / len(good) if good else 0.0
        for i in range(g, g + k):
            if i in dropped:
                values[i] = mean
    return dropped


@dataclass(frozen=True)
class WeightSync:
    wall_s: float  # from publishing to the last generator holding the version (waits for rollouts in flight)
    work_s: float  # publishing plus the slowest generator's own load: the sync's share of the critical path


def push_weights(svc: Services, version: int, published: Pending[dict[str, str]] | None = None) -> WeightSync:
    """Publish the trainer's weights as `version` (unless `published`, a publish already asked for) and load them
    into every generator."""
    t = time.perf_counter()
    location = (published or svc.trainer.push_weights.start(version)).get()
    publish_s = time.perf_counter() - t
    loads = svc.generators.update_weights.fanout(version, location).get()
    return WeightSync(time.perf_counter() - t, publish_s + max((x for x in loads if x is not None), default=0.0))


def train_and_push(svc: Services, batch: TrainBatch, version: int) -> tuple[dict[str, float], WeightSync]:
    """One optimizer step, then its weights published as `version` and loaded into every generator. The publish
    is queued right behind the step (an actor serves its messages in order), so no round trip to the controller
    sits between the two."""
    trained = svc.trainer.train_step.start(batch)
    published = svc.trainer.push_weights.start(version)
    return trained.get(), push_weights(svc, version, published)


def overlap_metrics(groups: list[list[Completion]], replicas: int, serial_s: float, step_s: float
                    ) -> dict[str, float]:
    """How close the step came to its ideal, max(generation, the rest): generation is the generators' own busy
    time (each response carries its share of its call, `Completion.gen_s`, spread over the replicas); the rest
    (scoring, the train step, publishing and loading weights) runs one piece after another on the loop's path.
    With `sync.mode=async` generation overlaps the rest, so 1.0 means nothing waited that need not have; on-policy
    runs them in turn, and the figure is the speed-up overlapping could at most bring, inverted."""
    busy = sum(c.gen_s for g in groups for c in g) / max(1, replicas)
    return {"time/generate_busy_s": busy, "time/serial_s": serial_s,
            "perf/overlap_efficiency": max(busy, serial_s) / step_s if step_s > 0 else float("nan")}


def train(cfg: TrainConfig, svc: Services, env: Environment, encode: Encode, state: LoopState, on_step: OnStep) -> None:
    """Run steps `state.step .. cfg.steps-1`; `on_step` logs, evaluates and checkpoints."""
    depth = cfg.sync.policy_age
    in_flight: deque[tuple[int, list[Sample], Pending[list[list[Completion]]], float]] = deque()
    multi_turn = MultiTurn(env, encode, cfg) if env.multi_turn else None

    def start_rollout(step: int, samples: list[Sample] | None = None) -> None:
        samples = samples or env.sample_batch(cfg.algorithm.prompts_per_step, state.data_rng)
        groups = multi_turn.generate(svc, samples, step) if multi_turn else \
            generate_groups(svc, samples, encode, cfg, step)
        in_flight.append((step, samples, groups, time.perf_counter()))

    for step, samples in state.pending:  # resumed mid-flight: the same prompts, regenerated
        start_rollout(step, samples)

    while state.step < cfg.steps:
        t_step = time.perf_counter()
        while len(in_flight) <= depth and (state.step + len(in_flight)) < cfg.steps:
            start_rollout(state.step + len(in_flight))
        _, samples, rollout, t_gen = in_flight.popleft()
        groups = rollout.get()
        t_generated = time.perf_counter()
        grouped, metrics, rollouts = score_groups(svc, samples, groups, cfg)
        svc.buffer.add.call(grouped)
        t_scored = time.perf_counter()

        serial_s = t_scored - t_generated
        sampled = svc.buffer.sample.call(state.version, len(grouped))
        if sampled is None:  # everything was too stale; the next rollout uses newer weights
            metrics["buffer/skipped_step"] = 1.0
        else:
            episodes, buffer_metrics = sampled
            metrics.update(buffer_metrics)
            t_train = time.perf_counter()
            state.version += 1
            trained, sync = train_and_push(svc, TrainBatch.of(episodes), state.version)
            metrics.update(trained)
            metrics["time/weight_sync_s"] = sync.wall_s
            train_s = time.perf_counter() - t_train - sync.wall_s  # up to the step's reply; the sync is timed apart
            serial_s += train_s + sync.work_s
        state.samples_seen += len(samples)
        step_s = time.perf_counter() - t_step
        metrics.update({
            "time/generate_s": t_generated - t_gen, "time/score_s": t_scored - t_generated,
            "time/step_s": step_s, "policy/version": float(state.version),
            **overlap_metrics(groups, len(svc.generators), serial_s, step_s),
        })
        state.step += 1
        state.pending = [(step, samples) for step, samples, _, _ in in_flight]
        on_step(state.step, metrics, rollouts)
