"""What a reward is, and the one place where gold labels are kept away from label-free rewards.

`Reward.score` is the only public entry point. A subclass declares `needs_gold`; when it is False the base
class hands `_score` the `Problem`s only (the type has no answer field), so a label-free reward such as
Weaver cannot read a gold label even by mistake: the isolation is structural, not a convention.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.registry import Registry
from rlexp.rewards.crossing import checked
from rlexp.types import Problem, RewardOutput, Sample

# Meta keys that would smuggle a gold label past the Problem/Sample split. Environments must not put the
# answer into `Problem.meta`; if one does, label-free rewards refuse to run rather than silently cheat.
_GOLD_LIKE_META_KEYS = frozenset({"answer", "gold", "gold_answer", "label", "solution", "target"})


class Reward:
    """Base class: validate the batch, strip gold when the reward is label-free, then call `_score`.

    Subclasses implement `_score(items, texts, group_size)` where `items` are `Sample`s when
    `needs_gold` is True and `Problem`s otherwise. Responses arrive grouped: `texts[g*group_size:(g+1)*group_size]`
    all answer the same problem, which group-level rewards (Weaver's window, selection) rely on.
    """

    name: ClassVar[str] = ""
    # True only for rewards that read gold labels (rule checks, the annotated oracle).
    needs_gold: ClassVar[bool] = True
    # A deterministic function of (samples, texts): no verifier to wait on, no state. A run then scores it in the
    # controller (rlexp.run.wiring), where it costs no message each way per step.
    pure: ClassVar[bool] = False
    # The closed interval every reward lies in, if the reward declares one; a value outside it (or
    # NaN/inf, always) is refused where it reaches the loop (rlexp.rewards.crossing).
    value_range: ClassVar[tuple[float, float] | None] = None
    # The verifiers a label-free reward scores with; model verifiers among them get their model attached by
    # the reward service (rlexp.actors.reward) once their services are up.
    verifiers: list[Any]

    @classmethod
    def chosen_verifiers(cls, options: dict[str, Any],
                         members: list[VerifierConfig]) -> list[VerifierConfig]:
        """The verifiers this reward scores with, from its options and the available members
        (`reward.verifiers`, or else the verifier set's): what it declares it needs, so the GPU
        layout serves those and no others. The default: a label-free reward (Weaver and its presets)
        scores with every member, one that reads gold labels with none. A reward that picks
        (single_rm) or needs none though label-free overrides this."""
        return [] if cls.needs_gold else list(members)

    def __init__(self, cfg: RewardConfig, env: Any, served: bool = True) -> None:
        """`served`: model verifiers are scored by services of their own (inside a run), or loaded into this
        process (`rlexp eval`, tests)."""
        self.cfg = cfg
        self.env = env
        self.served = served
        self.verifiers = []

    # --- public API -------------------------------------------------------------------------------
    def score(self, samples: Sequence[Sample], texts: Sequence[str], group_size: int) -> RewardOutput:
        samples, texts = list(samples), list(texts)
        if len(samples) != len(texts):
            raise ValueError(f"reward {self.name!r}: got {len(samples)} samples but {len(texts)} responses")
        if group_size < 1 or len(texts) % group_size:
            raise ValueError(f"reward {self.name!r}: batch of {len(texts)} responses is not a whole number of "
                             f"groups of size {group_size}")
        if self.needs_gold:
            out = self._score(samples, texts, group_size)
        else:
            self._hand_over_labels(samples, texts, group_size)
            out = self._score(strip_gold(samples), texts, group_size)
        if len(out.rewards) != len(texts):
            raise RuntimeError(f"reward {self.name!r} returned {len(out.rewards)} rewards for {len(texts)} responses")
        return out

    def _score(self, items: list[Any], texts: list[str], group_size: int) -> RewardOutput:
        raise NotImplementedError

    # --- a stated budget of gold labels for a label-free reward (Weaver's labelled dev set) --------------
    def label_request(self, n: int, group_size: int) -> list[int]:
        """Indices (of this batch's `n` responses, in groups of `group_size`) whose gold correctness the reward
        asks for before scoring. The default asks for none: a label-free reward stays label-free unless its
        config states a budget."""
        return []

    def receive_labels(self, labels: dict[int, bool]) -> None:
        """The gold correctness of the responses `label_request` named, by index in the batch."""

    def _hand_over_labels(self, samples: list[Any], texts: list[str], group_size: int) -> None:
        """The one place a label-free reward gets gold: only the correctness (a bool, never the answer) of the
        responses it asked for, checked by the environment; nothing when the batch carries no gold."""
        want = self.label_request(len(texts), group_size)
        if not want:
            return
        if not all(isinstance(s, Sample) for s in samples) or self.env is None:
            raise ValueError(f"reward {self.name!r} asks for {len(want)} gold labels (a labelled dev set, "
                             f"options.dev_labels) but this batch has no gold answers (evaluation-time selection "
                             f"scores Problems only); set options.class_balance=estimate or prior there")
        self.receive_labels({i: bool(checked(self.env, samples[i], texts[i]).correct)
                             for i in want})

    def state_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable state saved with the run checkpoint (stateless rewards return {})."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"reward {self.name!r} is stateless but the checkpoint holds reward state "
                             f"{sorted(state)}; was the run saved with a different reward?")


def strip_gold(samples: Sequence[Sample | Problem]) -> list[Problem]:
    """Return only what a policy may see, with `Problem.id` replaced by an opaque one.

    An environment's id can be derived from the gold answer (the guess game's `KQZ/3` ends in the hidden
    digit) or key something that is (a multiple-choice order), and no label-free verifier needs it: it only
    tells which responses answer the same problem (`majority` groups on it). So each distinct id becomes
    `problem<k>`, numbered by first appearance in this batch: equal ids stay equal, nothing else survives.
    Rejects meta that looks like it carries the answer."""
    problems = []
    opaque: dict[str, str] = {}
    for s in samples:
        p = s.problem if isinstance(s, Sample) else s
        if not isinstance(p, Problem):
            raise TypeError(f"expected Sample or Problem, got {type(s).__name__}")
        leaked = _GOLD_LIKE_META_KEYS.intersection(p.meta)
        if leaked:
            raise ValueError(f"problem {p.id!r} has gold-like meta keys {sorted(leaked)}; label-free rewards "
                             f"must not see the answer (fix the environment's Problem.meta)")
        problems.append(Problem(id=opaque.setdefault(p.id, f"problem{len(opaque)}"), prompt=p.prompt, meta=p.meta))
    return problems


# --- registry ---------------------------------------------------------------------------------------
REWARDS: Registry[type[Reward]] = Registry(
    "reward", Reward, "a subclass of rlexp.rewards.base.Reward; see examples/my_task")
register_reward = REWARDS.register


def reward_names() -> list[str]:
    return REWARDS.names()


def reward_class(name: str) -> type[Reward]:
    """A built-in name, one a plug-in registered, or `package.module:Class` (`rlexp.registry.Registry.get`)."""
    return REWARDS.get(name)


def plain(value: Any) -> Any:
    """OmegaConf containers (what Hydra hands over) -> plain dicts/lists, so options behave like dicts."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a hard dependency of rlexp
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value
