"""Verifier kinds (`VerifierConfig.kind`) as registered entries: each kind is a class that declares
what it is (holds a model and needs a service of its own, scores any environment or only those that
list it, measures agreement rather than correctness) and builds its verifier, so adding a kind is
one module of your own, not an edit of the schema's enum, the builder's if-chain, the environments
and Weaver.

A kind outside rlexp is registered with `@register_verifier_kind("name")` in a module listed in
`plugins`, or named as `kind: package.module:Class` in a verifier set (examples/my_verifier). The
built-ins' implementations are imported when a verifier is built, not here: environments' checks and
`rlexp plan` read the declarations only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from rlexp.config.reward import VerifierConfig
from rlexp.config.validate import check_options
from rlexp.registry import Registry
from rlexp.rewards.verifiers.answers import FormatVerifier, MajorityVerifier
from rlexp.rewards.verifiers.base import RULES, Rule, RuleVerifier

if TYPE_CHECKING:
    from rlexp.rewards.verifiers.base import Verifier

# Options read by the reward that combines verifiers (Weaver's per-verifier threshold), not by the
# verifier.
RESERVED_OPTIONS = frozenset({"threshold"})


class VerifierKind:
    """One kind of verifier. Class attributes are its declarations; `build` makes one verifier of
    the kind."""

    name: ClassVar[str] = ""
    # Holds a model of its own: inside a run it is scored by a service of its own (one GPU per
    # replica on CUDA), which `rlexp plan` counts, unless `options.policy` makes the policy itself
    # the model.
    model: ClassVar[bool] = False
    # Scores any environment's responses. False: only environments that list it
    # (`own_verifier_kinds`), e.g. `rule`, whose checks are written for one task.
    generic: ClassVar[bool] = True
    # Measures agreement or readability rather than correctness (Weaver's separable roles).
    separable: ClassVar[bool] = False
    # The dataclass of the verifier's `options` (names, types, defaults; unknown names refused with
    # the close matches); None: `build` receives the options as a dict and checks them itself.
    Options: ClassVar[type | None] = None

    @classmethod
    def build(cls, name: str, options: Any, env: Any, device: str) -> Verifier:
        """The verifier `name` of this kind with its `options` (an `Options` instance, or a dict),
        for `env` (None where no environment is at hand), loading any model onto `device`."""
        raise NotImplementedError(f"verifier kind {cls.name!r} does not say how to build one")


VERIFIER_KINDS: Registry[type[VerifierKind]] = Registry(
    "verifier kind",
    VerifierKind,
    "a VerifierKind subclass of rlexp.rewards.verifiers.kinds; see examples/my_verifier",
)
register_verifier_kind = VERIFIER_KINDS.register


def kind_of(v: VerifierConfig) -> type[VerifierKind]:
    """The kind class of verifier `v` (a registered name or package.module:Class; unknown: a
    PluginError)."""
    return VERIFIER_KINDS.get(str(v.kind))


def is_served(v: VerifierConfig) -> bool:
    """A model verifier that is not the policy itself: it gets a service of its own."""
    return kind_of(v).model and not bool((v.options or {}).get("policy", False))


def supports(env: Any, v: VerifierConfig) -> bool:
    """Whether verifier `v`'s kind may score `env` (`supported_kinds`; a kind named by import path
    counts as the class it names)."""
    cls, closed = kind_of(v), getattr(env, "verifier_kinds", None)
    listed = closed if closed is not None else frozenset(getattr(env, "own_verifier_kinds", ()))
    return str(v.kind) in listed or cls.name in listed or (closed is None and cls.generic)


def supported_kinds(env: Any) -> frozenset[str]:
    """The kinds a label-free reward may score `env` with: its closed `verifier_kinds` when it
    declares one, else every generic kind registered now plus its `own_verifier_kinds`."""
    closed = getattr(env, "verifier_kinds", None)
    if closed is not None:
        return frozenset(closed)
    return frozenset(VERIFIER_KINDS.having("generic")) | frozenset(
        getattr(env, "own_verifier_kinds", ())
    )


def kind_options(cls: type[VerifierKind], options: dict[str, Any], who: str) -> Any:
    """`options` without the reward's own keys, as the kind's `Options` dataclass when it declares
    one."""
    options = {k: v for k, v in options.items() if k not in RESERVED_OPTIONS}
    return options if cls.Options is None else check_options(cls.Options, options, who)


# --- the built-in kinds
# ----------------------------------------------------------------------------------------
def rule_names() -> list[str]:
    return RULES.names()


def build_rule(options: dict[str, Any], who: str) -> Rule:
    options = {k: v for k, v in options.items() if k not in RESERVED_OPTIONS}
    rule_name = options.pop("rule", None)
    if rule_name is None:
        raise ValueError(f"{who}: a rule verifier needs options.rule; choose one of {rule_names()}")
    rule_cls = RULES.get(str(rule_name))  # a built-in, a plug-in's, or package.module:Class
    try:
        return rule_cls(**options)
    except TypeError as e:
        raise ValueError(f"{who}: bad options {options} for rule {rule_name!r}: {e}") from e


@register_verifier_kind("rule")
class RuleKind(VerifierKind):
    """A task-specific check (a registered `Rule`, `options.rule`)."""

    generic = False

    @classmethod
    def build(cls, name: str, options: Any, env: Any, device: str) -> Verifier:
        from rlexp.rewards.verifiers import arithmetic  # noqa: F401  (registers its rules)

        return RuleVerifier(name, build_rule(options, f"verifier {name!r}"))


class _AnswerKind(VerifierKind):
    """Reads the answer a response states through the environment's extraction (no gold)."""

    separable = True
    verifier: ClassVar[type[FormatVerifier | MajorityVerifier]]

    @classmethod
    def build(cls, name: str, options: Any, env: Any, device: str) -> Verifier:
        if env is None:
            raise ValueError(
                f"verifier {name!r}: kind {cls.name} reads answers through the environment"
            )
        return cls.verifier(name, env)


@register_verifier_kind("format")
class FormatKind(_AnswerKind):
    """The response states an answer the environment can read."""

    verifier = FormatVerifier


@register_verifier_kind("majority")
class MajorityKind(_AnswerKind):
    """The response agrees with its group's most common answer."""

    verifier = MajorityVerifier


@register_verifier_kind("reward_model")
class RewardModelKind(VerifierKind):
    """A sequence-classification reward model, served apart."""

    model = True

    @classmethod
    def build(cls, name: str, options: Any, env: Any, device: str) -> Verifier:
        from rlexp.rewards.verifiers.reward_model import RewardModelVerifier

        return RewardModelVerifier(name, {**options, "device": device})


@register_verifier_kind("lm_judge")
class LMJudgeKind(VerifierKind):
    """A language model asked whether the answer is right, served apart (or the policy,
    `options.policy`)."""

    model = True

    @classmethod
    def build(cls, name: str, options: Any, env: Any, device: str) -> Verifier:
        from rlexp.rewards.verifiers.lm_judge import LMJudgeVerifier

        judge = LMJudgeVerifier(name, options, getattr(env, "answer_format", "free_form"))
        if not judge.opts.policy:
            judge.load(device=device)
        return judge  # a policy judge is attached to the generators by the reward service
