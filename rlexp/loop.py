"""The GRPO loop. Read this file first: it is the whole algorithm, written against a few services.

    for each step:
        samples      = environment.sample_batch(prompts_per_step)          # controller, seeded data order
        completions  = generators.generate(prompts, n=group_size)          # vLLM or TorchTitan replicas
        rewards      = reward.score(samples, completions)                  # verifier replicas (rule, RM, Weaver)
        advantages   = group_normalise(rewards)                            # GRPO
        buffer.add(groups)                                                  # replay buffer actor
        batch        = buffer.sample(current_version)                      # drops samples that are too stale
        metrics      = trainer.train_step(batch)                            # clipped surrogate vs generator logprobs
        generators.update_weights(trainer.push_weights(version + 1))        # weight sync

`sync.mode=on_policy` runs these in order. `sync.mode=async` keeps up to `sync.max_policy_age` rollouts
in flight while the trainer works, so generation and training overlap; what arrives too stale is dropped
(and counted). Message order to each actor is fixed, so both modes are deterministic for a given seed.
"""
from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from rlexp.actors.buffer import Episode
from rlexp.actors.trainer import TrainBatch
from rlexp.envs.base import Environment
from rlexp.grpo import group_advantages
from rlexp.seeding import request_seed
from rlexp.types import Completion, RewardOutput, Sample


@dataclass
class Services:
    """Handles to the actor graph (each an actor mesh; `generators` has one mesh per replica)."""

    generators: list[Any]
    trainer: Any  # one actor per trainer rank; call its endpoints with `on_trainer` (they are collective)
    rewards: list[Any]  # one handle per reward replica
    buffer: Any
    reference: Any | None = None  # on the trainer's processes; collective like the trainer


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


def generate_groups(svc: Services, samples: list[Sample], encode: Callable[[str], list[int]], cfg: Any,
                    replica_seeds: list[int], step: int) -> Any:
    """Split the prompts over the generator replicas; returns a callable that collects the completions."""
    prompts = [encode(s.problem.prompt) for s in samples]
    n_rep = len(svc.generators)
    chunks = [list(range(i, len(prompts), n_rep)) for i in range(n_rep)]
    futures = [g.generate.call_one([prompts[j] for j in idx], cfg.algorithm.group_size, cfg.algorithm.max_tokens,
                                   cfg.algorithm.temperature, request_seed(replica_seeds[r], step))
               for r, (g, idx) in enumerate(zip(svc.generators, chunks))]

    def collect() -> list[list[Completion]]:
        groups: list[list[Completion] | None] = [None] * len(prompts)
        k = cfg.algorithm.group_size
        for fut, idx in zip(futures, chunks):
            flat = fut.get()
            for pos, j in enumerate(idx):
                groups[j] = flat[pos * k:(pos + 1) * k]
        return groups  # type: ignore[return-value]

    return collect


def score_and_group(svc: Services, samples: list[Sample], groups: list[list[Completion]], cfg: Any
                    ) -> tuple[list[list[Episode]], dict[str, float], list[dict[str, Any]]]:
    """Rewards, advantages and (optional) reference logprobs for every response, as episodes per group.
    Also returns a few scored rollouts, for the trackers' rollout tables."""
    k = cfg.algorithm.group_size
    flat_samples = [s for s in samples for _ in range(k)]
    flat = [c for g in groups for c in g]
    scored = score(svc, flat_samples, [c.text for c in flat], k)
    rewards = torch.tensor(scored.rewards, dtype=torch.float32)
    adv = group_advantages(rewards, k, cfg.algorithm.norm_adv_by_std)
    ref = None
    if svc.reference is not None:
        ref = on_trainer(svc.reference.logprobs, [c.prompt_ids for c in flat], [c.token_ids for c in flat],
                         cfg.algorithm.temperature)  # the reference lives on the trainer's ranks
    episodes = [Episode(c.prompt_ids, c.token_ids, c.logprobs, float(a), float(r), c.policy_version,
                        ref[i] if ref else None) for i, (c, a, r) in enumerate(zip(flat, adv, rewards))]
    grouped = [episodes[i:i + k] for i in range(0, len(episodes), k)]
    if cfg.algorithm.filter_zero_adv_groups:
        grouped = [g for g in grouped if any(e.advantage != 0.0 for e in g)] or grouped
    metrics = {"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()),
               "reward/zero_adv_groups": float(sum(all(e.advantage == 0.0 for e in g) for g in grouped)) / len(grouped),
               "response/len_mean": sum(len(c.token_ids) for c in flat) / len(flat)}
    metrics.update(scored.metrics)
    shown = min(len(flat), cfg.logger.rollout_samples)
    rollouts = [{"prompt": flat_samples[i].problem.prompt, "response": flat[i].text, "reward": float(rewards[i]),
                 "advantage": float(adv[i]), "policy_version": flat[i].policy_version,
                 **(scored.details[i] if i < len(scored.details) else {})} for i in range(shown)]
    return grouped, metrics, rollouts


def score(svc: Services, samples: list[Sample], texts: list[str], k: int) -> RewardOutput:
    """Whole groups are spread over the reward replicas (Weaver's label model needs complete groups)."""
    n_rep = len(svc.rewards)
    n_groups = len(samples) // k
    bounds = [(n_groups * r // n_rep) * k for r in range(n_rep + 1)]
    futures = [svc.rewards[r].score.call_one(samples[a:b], texts[a:b], k)
               for r, (a, b) in enumerate(zip(bounds, bounds[1:])) if b > a]
    parts = [f.get() for f in futures]
    out = RewardOutput(rewards=[x for p in parts for x in p.rewards],
                       details=[d for p in parts for d in p.details])
    for key in parts[0].metrics:  # replica metrics averaged, weighted by their share of the batch
        out.metrics[key] = sum(p.metrics.get(key, 0.0) * len(p.rewards) for p in parts) / len(out.rewards)
    return out


def to_batch(episodes: list[Episode]) -> TrainBatch:
    has_ref = all(e.ref_logprobs is not None for e in episodes)
    return TrainBatch([e.prompt_ids for e in episodes], [e.response_ids for e in episodes],
                      [e.logprobs for e in episodes], [e.advantage for e in episodes],
                      [e.ref_logprobs for e in episodes] if has_ref else None)  # type: ignore[misc]


def rank0(values: Any) -> Any:
    """Rank 0's entry of a ValueMesh (what `endpoint.call(...).get()` returns)."""
    return next(iter(values.values()))


def on_trainer(endpoint: Any, *args: Any) -> Any:
    """Call a trainer endpoint on every rank (FSDP-sharded endpoints are collectives) and return rank 0's
    answer; with one rank this is `endpoint.call_one(*args).get()`."""
    return rank0(endpoint.call(*args).get())


def push_weights(svc: Services, version: int) -> float:
    t = time.perf_counter()
    location = on_trainer(svc.trainer.push_weights, version)
    for reloaded in [g.update_weights.call_one(version, location) for g in svc.generators]:  # all replicas at once
        reloaded.get()
    return time.perf_counter() - t


def train(cfg: Any, svc: Services, env: Environment, encode: Callable[[str], list[int]], state: LoopState,
          replica_seeds: list[int], on_step: Callable[[int, dict[str, float], list[dict[str, Any]]], None]) -> None:
    """Run steps `state.step .. cfg.steps-1`; `on_step` logs, evaluates and checkpoints."""
    depth = cfg.sync.max_policy_age if cfg.sync.mode == "async" else 0
    in_flight: deque[tuple[int, list[Sample], Any, float]] = deque()

    def start_rollout(step: int, samples: list[Sample] | None = None) -> None:
        samples = samples or env.sample_batch(cfg.algorithm.prompts_per_step, state.data_rng)
        in_flight.append((step, samples, generate_groups(svc, samples, encode, cfg, replica_seeds, step),
                          time.perf_counter()))

    for step, samples in state.pending:  # resumed mid-flight: the same prompts, regenerated
        start_rollout(step, samples)

    while state.step < cfg.steps:
        t_step = time.perf_counter()
        while len(in_flight) <= depth and (state.step + len(in_flight)) < cfg.steps:
            start_rollout(state.step + len(in_flight))
        _, samples, collect, t_gen = in_flight.popleft()
        groups = collect()
        t_generated = time.perf_counter()
        grouped, metrics, rollouts = score_and_group(svc, samples, groups, cfg)
        svc.buffer.add.call_one(grouped).get()
        t_scored = time.perf_counter()

        sampled = svc.buffer.sample.call_one(state.version, len(grouped)).get()
        if sampled is None:  # everything was too stale; the next rollout uses newer weights
            metrics["buffer/skipped_step"] = 1.0
        else:
            episodes, buffer_metrics = sampled
            metrics.update(buffer_metrics)
            metrics.update(on_trainer(svc.trainer.train_step, to_batch(episodes)))
            state.version += 1
            metrics["time/weight_sync_s"] = push_weights(svc, state.version)
        state.samples_seen += len(samples)
        metrics.update({
            "time/generate_s": t_generated - t_gen, "time/score_s": t_scored - t_generated,
            "time/step_s": time.perf_counter() - t_step, "policy/version": float(state.version),
        })
        state.step += 1
        state.pending = [(step, samples) for step, samples, _, _ in in_flight]
        on_step(state.step, metrics, rollouts)
