"""Plain data passed between rlexp's services, one step's worth.

Kept free of torch so that rewards, environments and trackers can be imported (and tested) without
spawning anything. The split between `Problem` and `Sample` is deliberate: label-free rewards such as
Weaver receive `Problem`s, which have no gold-answer field at all, so a gold label cannot leak into them.
The types a checkpoint stores (`Sample`, `Episode`) convert to and from plain Python values (`to_plain` /
`from_plain`): a checkpoint then loads with `torch.load(weights_only=True)` and never unpickles code.

The two batches that cross an actor boundary every step, a generator's reply (`Completions`) and the trainer's
`TrainBatch`, travel as a few contiguous arrays (token ids, logprobs, per-row scalars, each ragged field flat with
its row lengths, texts as one string) rather than as thousands of Python objects: Monarch's pickler runs Python code
for every object it writes, several ms per step on two cores (studies/perf/results/perf_cpu.md).
Only the wire format changes (`__reduce__`): in memory they are the same lists and dataclasses, so code that calls
an actor in-process (`rlexp.core.services.Local`) pays nothing, and every value round-trips bit for bit (floats
travel as float64, which holds any Python float exactly). The arrays are numpy's: Monarch copies one as a single
buffer, where a torch tensor goes through `torch.save` at about four times the cost per array on this path.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from operator import attrgetter
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


def _ragged(rows: Sequence[Sequence[float]], dtype: str) -> tuple[Any, Any]:
    """`rows` as one flat array and the rows' lengths: two arrays, however many rows."""
    import numpy as np  # only on the wire: this module imports the standard library alone (docs/DESIGN.md)

    return np.fromiter((x for r in rows for x in r), dtype=dtype), np.fromiter(map(len, rows), dtype=np.int64)


def _split(flat: Any, lengths: Any) -> list[Any]:
    """`flat` (a list or a string) cut into consecutive pieces of `lengths` (an array)."""
    out, at = [], 0
    for n in lengths.tolist():
        out.append(flat[at:at + n])
        at += n
    return out


def _unragged(flat: Any, lengths: Any) -> list[list[Any]]:
    return _split(flat.tolist(), lengths)


def _shared_rows(rows: Sequence[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct row objects of `rows` (a group's samples share their prompt's list) and each row's index among
    them, so a prompt travels once per prompt, not once per sample, and rows that shared a list still do."""
    index: dict[int, int] = {}
    distinct: list[list[int]] = []
    which = []
    for r in rows:
        k = index.get(id(r))
        if k is None:
            k = index[id(r)] = len(distinct)
            distinct.append(r)
        which.append(k)
    return distinct, which


_EXTRAS = tuple(f.name for f in fields(Completion)
                if f.name not in ("prompt_ids", "token_ids", "logprobs", "text", "policy_version", "finish_reason",
                                  "gen_s"))
_extras_of = attrgetter(*_EXTRAS)
_NO_EXTRAS = tuple(f.default for f in fields(Completion) if f.name in _EXTRAS)


def _texts(texts: Sequence[str]) -> tuple[str, Any]:
    import numpy as np

    return "".join(texts), np.fromiter(map(len, texts), dtype=np.int64)


class Completions(list):
    """A generator's reply: a plain `list[Completion]` that crosses a process boundary packed (see the module
    docstring). The fields a single response leaves at their defaults (the multi-turn ones) travel only when set."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        import numpy as np

        prompts, which = _shared_rows([c.prompt_ids for c in self])
        extras = [_extras_of(c) for c in self]
        reasons = sorted({c.finish_reason for c in self})
        code = {r: i for i, r in enumerate(reasons)}
        return _unpack_completions, (
            _ragged(prompts, "int64"), np.array(which, dtype=np.int64),
            _ragged([c.token_ids for c in self], "int64"), _ragged([c.logprobs for c in self], "float64"),
            np.array([c.policy_version for c in self], dtype=np.int64),
            np.array([c.gen_s for c in self], dtype=np.float64),
            _texts([c.text for c in self]), reasons, np.array([code[c.finish_reason] for c in self], dtype=np.int64),
            extras if any(e != _NO_EXTRAS for e in extras) else None)


def _unpack_completions(prompts: tuple[Any, Any], which: Any, tokens: tuple[Any, Any], logprobs: tuple[Any, Any],
                        versions: Any, gen_s: Any, texts: tuple[str, Any], reasons: list[str], finish: Any,
                        extras: list[tuple[Any, ...]] | None) -> Completions:
    distinct = _unragged(*prompts)
    rows = zip(which.tolist(), _unragged(*tokens), _unragged(*logprobs), versions.tolist(), gen_s.tolist(),
               _split(*texts), finish.tolist())
    out = Completions(Completion(prompt_ids=distinct[w], token_ids=t, logprobs=lp, text=x, policy_version=v,
                                 finish_reason=reasons[f], gen_s=g) for w, t, lp, v, g, x, f in rows)
    for c, e in zip(out, extras or ()):
        for k, v in zip(_EXTRAS, e):
            setattr(c, k, v)
    return out


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

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Packed for the trip to the trainer (see the module docstring)."""
        import numpy as np

        prompts, which = _shared_rows(self.prompts)
        return _unpack_train_batch, (
            _ragged(prompts, "int64"), np.array(which, dtype=np.int64),
            _ragged(self.responses, "int64"), _ragged(self.old_logprobs, "float64"),
            np.array(self.advantages, dtype=np.float64),
            None if self.ref_logprobs is None else _ragged(self.ref_logprobs, "float64"),
            None if self.loss_masks is None else _ragged(self.loss_masks, "int64"))

    @staticmethod
    def of(episodes: list[Episode]) -> TrainBatch:
        has_ref = all(e.ref_logprobs is not None for e in episodes)
        masked = any(e.loss_mask is not None for e in episodes)
        return TrainBatch([e.prompt_ids for e in episodes], [e.response_ids for e in episodes],
                          [e.logprobs for e in episodes], [e.advantage for e in episodes],
                          [e.ref_logprobs for e in episodes] if has_ref else None,  # type: ignore[misc]
                          [e.loss_mask if e.loss_mask is not None else [1] * len(e.response_ids) for e in episodes]
                          if masked else None)


def _unpack_train_batch(prompts: tuple[Any, Any], which: Any, responses: tuple[Any, Any], old: tuple[Any, Any],
                        advantages: Any, ref: tuple[Any, Any] | None, masks: tuple[Any, Any] | None) -> TrainBatch:
    distinct = _unragged(*prompts)
    return TrainBatch([distinct[w] for w in which.tolist()], _unragged(*responses), _unragged(*old),
                      advantages.tolist(), None if ref is None else _unragged(*ref),
                      None if masks is None else _unragged(*masks))
