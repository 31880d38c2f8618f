"""Plain data passed between rlexp's services, one step's worth.

Kept free of torch so that rewards, environments and trackers can be imported (and tested) without
spawning anything. The split between `Problem` and `Sample` is deliberate: label-free rewards such as
Weaver receive `Problem`s, which have no gold-answer field at all, so a gold label cannot leak into them.
The types a checkpoint stores (`Sample`, `Episode`) convert to and from plain Python values (`to_plain` /
`from_plain`): a checkpoint then loads with `torch.load(weights_only=True)` and never unpickles code.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """What a policy (and a label-free verifier) may see: the id and the formatted prompt."""

    id: str
    prompt: str
    # Environment-specific, non-secret data (e.g. the choices of a multiple-choice item, as the prompt shows them).
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """A problem together with its gold answer. Only gold-using rewards and evaluation read `answer`."""

    problem: Problem
    answer: str

    @property
    def id(self) -> str:
        return self.problem.id

    def to_plain(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_plain(d: dict[str, Any]) -> Sample:
        return Sample(Problem(**d["problem"]), d["answer"])


@dataclass
class Completion:
    """One generated response, with the sampling logprobs the trainer needs for off-policy correction."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    policy_version: int
    finish_reason: str = "stop"
    # Multi-turn episodes (rlexp/algorithm/rollouts.py) fill the fields below; a single response leaves them as
    # they are.
    # `token_ids` then holds every token after the prompt: the policy's turns and the environment's replies.
    # loss_mask[i] is 1 where the policy wrote token i and 0 where the environment did (None: all the policy's).
    loss_mask: list[int] | None = None
    # The transcript after the prompt, segment by segment: {"role": "policy" | "environment", "text": ...}.
    segments: list[dict[str, str]] | None = None
    turn_versions: list[int] | None = None  # the policy version of each turn; `policy_version` is the oldest
    tool_calls: int = 0
    tool_errors: int = 0
    env_s: float = 0.0  # seconds spent in the environment (tools included) for this episode
    # This response's share of its generator call's seconds (the call's time / responses it returned; an episode
    # sums its turns'): summed over a step and divided by the replicas, the generators' own busy time, which the
    # loop's overlap figure compares with the step (loop.py, `perf/overlap_efficiency`).
    gen_s: float = 0.0
    turn_reward: float = 0.0  # sum of per-turn rewards (Environment.turn_reward), added to the episode reward

    @property
    def turns(self) -> int:
        return len(self.turn_versions) if self.turn_versions is not None else 1


@dataclass
class RewardOutput:
    """Rewards for a batch of responses plus per-step diagnostics that trackers log as-is."""

    rewards: list[float]
    metrics: dict[str, float] = field(default_factory=dict)
    # Per response extras (e.g. per-verifier scores) written to rollout tables; must be JSON-serialisable.
    details: list[dict[str, Any]] = field(default_factory=list)

    @staticmethod
    def concat(parts: list[RewardOutput]) -> RewardOutput:
        """Outputs of consecutive slices of one batch as one; metrics are averaged weighted by each
        slice's share of the batch (each replica reports means over its own slice), except the request counts of
        each replica's own verifier services (`service/...`: summed; replicas alive: the fewest any one sees)."""
        out = RewardOutput(rewards=[x for p in parts for x in p.rewards], details=[d for p in parts for d in p.details])
        for key in parts[0].metrics:
            values = [p.metrics.get(key, 0.0) for p in parts]
            if key.startswith("service/"):
                out.metrics[key] = min(values) if key.endswith("/replicas") else sum(values)
            else:
                out.metrics[key] = sum(v * len(p.rewards) for v, p in zip(values, parts)) / len(out.rewards)
        return out


@dataclass
class Episode:
    """A scored response, ready for the replay buffer and the trainer."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # the generator's, for the importance ratio
    advantage: float
    reward: float
    policy_version: int  # multi-turn: the oldest turn's, so staleness is judged by the oldest turn
    ref_logprobs: list[float] | None = None
    # Multi-turn: 1 where the policy wrote the response token, 0 where the environment did (masked out of the
    # loss, the KL and the importance ratio). None: every token is the policy's.
    loss_mask: list[int] | None = None

    def to_plain(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_plain(d: dict[str, Any]) -> Episode:
        return Episode(**d)


@dataclass
class TrainBatch:
    """One optimizer step's rows, as the trainer consumes them."""

    prompts: list[list[int]]
    responses: list[list[int]]
    old_logprobs: list[list[float]]  # the generator's logprobs of the sampled tokens
    advantages: list[float]
    ref_logprobs: list[list[float]] | None = None
    loss_masks: list[list[int]] | None = None  # None: every response token is trained on

    @staticmethod
    def of(episodes: list[Episode]) -> TrainBatch:
        has_ref = all(e.ref_logprobs is not None for e in episodes)
        masked = any(e.loss_mask is not None for e in episodes)
        return TrainBatch([e.prompt_ids for e in episodes], [e.response_ids for e in episodes],
                          [e.logprobs for e in episodes], [e.advantage for e in episodes],
                          [e.ref_logprobs for e in episodes] if has_ref else None,  # type: ignore[misc]
                          [e.loss_mask if e.loss_mask is not None else [1] * len(e.response_ids) for e in episodes]
                          if masked else None)
