"""Test-time selection for `rlexp eval selection=...`: the Weaver paper's own measurement.

Each problem gets `n` sampled responses; a selector picks one of them without gold, and the benchmark
reports how often the pick is right (selection accuracy) beside pass@n (some response is right: the
ceiling of any selector) and accuracy@1 (a response drawn at random). pass@n minus selection accuracy
is the generation-verification gap the paper measures.

Modes (`MODES`; each picks the first response among equal best, so picks are deterministic):
  weaver         highest Weaver posterior P(correct | votes): the latent-class label model of
                 rlexp/rewards/weaver.py fit, label-free, on this benchmark's responses (all of them)
  mean           highest unweighted mean of the active verifiers' normalised scores (Weaver, combine=mean)
  vote           highest majority vote of the active verifiers' binary votes (Weaver, combine=vote)
  majority       the most common answer (`env.extract`; ties: the answer seen first); no verifiers; = maj@n
  best_verifier  the single verifier whose own highest-scored pick is right most often, chosen WITH gold on
                 the very problems it is reported on: an oracle choice, the upper bound for any one
                 verifier (no held-out split is carved out; see `measure`)

Gold isolation. Selection (`Selector.select`) receives `Problem`s and response texts only, and the Weaver
rewards it calls are label-free (`needs_gold = False`, so the `Reward` base class would strip gold even if
a `Sample` were passed). Gold enters only afterwards, in `measure`, as each response's `env.check` outcome:
to score the picks, to measure each verifier's TPR/FPR, and to make the oracle `best_verifier` choice.

Verifiers come from a verifier set (conf/verifier_set/<name>.yaml; by default the benchmark's
environment name, like `optional verifier_set: ${environment}` in train.yaml), built in this process
(`served=False`); model verifiers' checkpoints are resolved with `rlexp.run.prepare.verifier_checkpoint`, and a
policy LM judge (`options.policy: true`) is given the evaluated model (`attach_policy`). The verifiers are
scored once: the mean and vote rewards share the label-model reward's scores.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from rlexp.config.paths import CONF_DIR
from rlexp.config.reward import VerifierConfig, VerifierSetConfig
from rlexp.evals.metrics import pass_at_k, wilson_interval
from rlexp.rewards.verifiers.kinds import is_served, supported_kinds, supports
from rlexp.types import Problem

log = logging.getLogger(__name__)

# What each mode is, for `rlexp eval --help` and the results' notes.
MODES: dict[str, str] = {
    "weaver": "highest Weaver posterior P(correct | votes) (label model fit on the benchmark's responses, no gold)",
    "majority": "most common extracted answer (ties: the first seen); uses no verifier",
    "best_verifier": "the one verifier whose pick is right most often, chosen with gold on the same problems: "
                     "oracle choice (upper bound for a single verifier)",
    "mean": "highest mean of the verifiers' normalised scores (Weaver combine=mean)",
    "vote": "highest majority vote of the verifiers' binary votes (Weaver combine=vote)",
}
# Modes scored by a Weaver reward, and its `options.combine` for each.
COMBINE = {"weaver": "label_model", "mean": "mean", "vote": "vote"}
ORACLE_NOTE = "oracle choice (upper bound for a single verifier)"


class SelectionError(ValueError):
    """A bad `selection` / `verifier_set` input: reported as one line by `rlexp eval`."""


def parse_modes(value: Any) -> list[str]:
    """`selection` as given (None, "none", "weaver", "[weaver,mean]", a list) -> the modes, in order, once each."""
    if value is None:
        return []
    if isinstance(value, str):
        items = [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]
    else:
        items = [str(v).strip() for v in (OmegaConf.to_object(value) if OmegaConf.is_config(value) else value)]
    if items == ["none"] or not items:
        return []
    unknown = [m for m in items if m not in MODES]
    if unknown:
        raise SelectionError(f"selection={value}: unknown mode(s) {unknown}; choose none or any of {list(MODES)} "
                             f"(several as selection=[weaver,mean])")
    return list(dict.fromkeys(items))


def needs_verifiers(modes: Sequence[str]) -> bool:
    return any(m != "majority" for m in modes)


# --- building -------------------------------------------------------------------------------------------------
def verifier_set_path(name: str, conf_dir: str | Path = CONF_DIR) -> Path:
    """conf_dir/verifier_set/NAME.yaml, falling back to the packaged set of that name."""
    for d in dict.fromkeys([Path(conf_dir), Path(CONF_DIR)]):
        p = d / "verifier_set" / f"{name}.yaml"
        if p.exists():
            return p
    return Path(conf_dir) / "verifier_set" / f"{name}.yaml"


def verifier_set_config(node: Any, where: str) -> VerifierSetConfig:
    """A typed verifier set from a YAML mapping (unknown keys and kinds fail here, naming `where`)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(VerifierSetConfig), node)
        vs: VerifierSetConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except Exception as e:  # omegaconf's validation errors have no common base worth naming
        raise SelectionError(f"verifier_set {where}: {e}") from e
    if not vs.members:
        raise SelectionError(f"verifier_set {where} lists no members")
    return vs


def load_verifier_set(name: str, conf_dir: str | Path = CONF_DIR, *, why: str = "") -> VerifierSetConfig:
    """The set `name` read by path (as train.yaml's `optional verifier_set: ${environment}` would select it)."""
    path = verifier_set_path(name, conf_dir)
    if not path.exists():
        have = sorted(p.stem for p in (Path(CONF_DIR) / "verifier_set").glob("*.yaml"))
        raise SelectionError(f"no verifier set {name!r}{why}: {path} does not exist; pass verifier_set=NAME "
                             f"(one of {have})")
    vs = verifier_set_config(OmegaConf.load(path), f"{name} ({path})")
    vs.name = vs.name or name
    return vs


def default_options(conf_dir: str | Path = CONF_DIR) -> dict[str, Any]:
    """Weaver's options as `reward=weaver` uses them in training (conf/reward/weaver.yaml), so selection
    and the training reward are the same label model."""
    for d in dict.fromkeys([Path(conf_dir), Path(CONF_DIR)]):
        p = d / "reward" / "weaver.yaml"
        if p.exists():
            return dict(OmegaConf.to_container(OmegaConf.load(p).get("options") or {}, resolve=True))  # type: ignore[arg-type]
    return {}


class _Shared:
    """A verifier scored once for every reward that holds it (the label-model, mean and vote rewards)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.kind = inner, inner.name, getattr(inner, "kind", "")
        self._key: tuple[Any, ...] | None = None
        self._scores: np.ndarray | None = None

    def score(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        key = (tuple((p.id, p.prompt) for p in problems), tuple(texts))
        if key != self._key or self._scores is None:
            self._scores = np.asarray(self.inner.score(problems, texts), dtype=np.float64)
            self._key = key
        return self._scores


@dataclass
class Selection:
    """What selection decided, without gold: per mode, the index (within its group) of each problem's pick."""

    n: int
    modes: list[str]
    # Per label-free mode, the pick per problem (`best_verifier` is decided in `measure`, with gold).
    picks: dict[str, list[int]]
    # Per verifier, its own pick per problem (the highest raw score; ties: the first).
    verifier_picks: dict[str, list[int]] = field(default_factory=dict)
    scores: dict[str, list[float]] = field(default_factory=dict)  # per verifier, every response's raw score
    votes: dict[str, list[int]] = field(default_factory=dict)  # per verifier, its binarised vote (Weaver's)
    posterior: list[float] = field(default_factory=list)
    weaver_metrics: dict[str, float] = field(default_factory=dict)  # the label-model reward's metrics
    dropped: dict[str, str] = field(default_factory=dict)  # verifier -> why Weaver dropped it


class Selector:
    """The selectors of one benchmark: its environment, the chosen modes and (unless only `majority`) a verifier set."""

    def __init__(self, modes: Sequence[str], env: Any, n_problems: int, verifier_set: VerifierSetConfig | None = None,
                 options: dict[str, Any] | None = None) -> None:
        self.modes = list(modes)
        self.env = env
        self.verifier_set = verifier_set
        self.members: list[VerifierConfig] = []
        self.rewards: dict[str, Any] = {}  # combine -> Weaver reward
        self.names: list[str] = []
        if not needs_verifiers(self.modes):
            return
        if verifier_set is None:
            raise SelectionError(f"selection={self.modes} needs a verifier set")
        kinds = supported_kinds(env)
        bad = [v.name for v in verifier_set.members if not supports(env, v)]
        if bad:
            raise SelectionError(f"verifier_set={verifier_set.name}: verifier(s) {bad} are of kinds environment="
                                 f"{env.name} does not support (it supports {sorted(kinds)}); "
                                 f"use the "
                                 f"set made for it (verifier_set={env.name}) or another")
        members = list(verifier_set.members)
        if any(is_served(v) for v in members):
            from rlexp.config.validate import ConfigError
            from rlexp.rewards.verifiers.registry import verifier_checkpoint  # imports torch: model verifiers only

            try:
                members = [verifier_checkpoint(v) if is_served(v) else v for v in members]
            except ConfigError as e:
                raise SelectionError(f"verifier_set={verifier_set.name}: {e}") from e
        self.members = members
        from rlexp.config.reward import RewardConfig
        from rlexp.rewards.registry import build_reward

        opts = {**(options or {}), "window_groups": max(1, int(n_problems))}  # fit on every problem at once
        combines = ["label_model"] + [COMBINE[m] for m in self.modes if m in COMBINE and COMBINE[m] != "label_model"]
        try:
            # The label-model reward loads the verifiers (models in this process); the others are built
            # with stand-ins (served=True: nothing loads) and then share its verifiers, scored once.
            primary = build_reward(RewardConfig(name="weaver", verifiers=members,
                                                options={**opts, "combine": "label_model"}), env, served=False)
            shared = [_Shared(v) for v in primary.verifiers]
            primary.verifiers = shared
            self.rewards["label_model"] = primary
            for c in combines[1:]:
                r = build_reward(RewardConfig(name="weaver", verifiers=members, options={**opts, "combine": c}),
                                 env, served=True)
                r.verifiers = shared
                self.rewards[c] = r
        except ValueError as e:
            raise SelectionError(f"verifier_set={verifier_set.name}: {e}") from e
        self.names = list(primary.names)

    def attach_policy(self, backend: Any, tokenizer: Any) -> list[str]:
        """Give LM judges that are the policy itself (`options.policy: true`) the evaluated model."""
        from rlexp.rewards.verifiers.lm_judge import LMJudgeVerifier

        attached = []
        for v in self.rewards["label_model"].verifiers if self.rewards else []:
            inner = v.inner
            if isinstance(inner, LMJudgeVerifier) and inner.opts.policy:
                inner.attach(backend.next_token_logprobs, tokenizer)
                attached.append(inner.name)
        return attached

    def describe(self) -> dict[str, Any]:
        """For the manifest: the modes and the verifiers as resolved (checkpoint folders included)."""
        return {"modes": self.modes,
                "verifier_set": self.verifier_set.name if self.verifier_set and self.members else None,
                "verifiers": [{"name": v.name, "kind": str(v.kind), "options": dict(v.options)} for v in self.members]}

    def select(self, problems: Sequence[Problem], texts: Sequence[str], n: int) -> Selection:
        """Pick one response per problem for every mode. `problems[i]` is the problem `texts[i]` answers; each
        problem's `n` responses are consecutive. Gold is not an input."""
        problems, texts = list(problems), list(texts)
        if n < 1 or len(texts) != len(problems) or len(texts) % n:
            raise ValueError(f"selection: {len(texts)} responses, {len(problems)} problems, n={n}: need n per problem")
        if any(not isinstance(p, Problem) for p in problems):
            raise TypeError("selection takes Problems (no gold), not Samples")
        sel = Selection(n=n, modes=list(self.modes), picks={})
        outs: dict[str, Any] = {}
        for combine, reward in self.rewards.items():
            outs[combine] = reward.score(problems, texts, group_size=n)
        if outs:
            lm = outs["label_model"]
            sel.posterior = [float(x) for x in lm.rewards]
            sel.weaver_metrics = dict(lm.metrics)
            sel.dropped = dict(self.rewards["label_model"].dropped)
            for name in self.names:
                sel.scores[name] = [float(d["scores"][name]) for d in lm.details]
                sel.votes[name] = [int(d["votes"][name]) for d in lm.details]
                sel.verifier_picks[name] = argmax_groups(sel.scores[name], n)
        for mode in self.modes:
            if mode in COMBINE:
                sel.picks[mode] = argmax_groups(outs[COMBINE[mode]].rewards, n)
            elif mode == "majority":
                answers = [self.env.extract(p, t) for p, t in zip(problems, texts)]
                sel.picks[mode] = [majority_pick(answers[g:g + n]) for g in range(0, len(answers), n)]
        return sel


# --- picking (no gold) -------------------------------------------------------------------------------------------
def argmax_groups(values: Sequence[float], n: int) -> list[int]:
    """Per consecutive group of `n`, the index of its highest value; ties go to the first (deterministic)."""
    out = []
    for g in range(0, len(values), n):
        grp = [float(v) for v in values[g:g + n]]
        out.append(max(range(len(grp)), key=lambda i: (grp[i], -i)))
    return out


def majority_pick(answers: Sequence[str | None]) -> int:
    """The first response giving the most common answer (ties: the answer seen first, as `maj@n` counts);
    when no response gives an answer, the first response."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0
    top = max(votes.values())
    return next(i for i, a in enumerate(answers) if a is not None and votes[a] == top)


# --- measuring (gold) ----------------------------------------------------------------------------------------
@dataclass
class VerifierRow:
    name: str
    status: str  # "active" or "dropped: <why>"
    weaver_tpr: float | None
    weaver_fpr: float | None
    tpr: float | None  # measured against env.check: P(vote = 1 | correct)
    fpr: float | None  # P(vote = 1 | wrong)
    accuracy: float  # P(vote = correct)
    select_accuracy: float  # accuracy of its own pick per problem


@dataclass
class SelectionReport:
    """Selection measured against gold, for results.md/csv and the manifest."""

    n: int
    modes: list[str]
    verifier_set: str | None
    metrics: dict[str, float]
    picks: dict[str, list[int]] = field(default_factory=dict)  # per mode, best_verifier included
    verifiers: list[VerifierRow] = field(default_factory=list)
    best_verifier: str | None = None


def _rate(votes: np.ndarray, mask: np.ndarray) -> float | None:
    return float(votes[mask].mean()) if mask.any() else None


def measure(sel: Selection, correct: Sequence[bool], *, verifier_set: str | None = None) -> SelectionReport:
    """Score the picks with gold (`correct[i]`: env.check of response i), measure each verifier's TPR/FPR and make
    the oracle `best_verifier` choice.

    best_verifier is chosen with gold on the same problems it is reported on (the verifier whose own pick is
    right most often; ties: the first in the set). Carving a labelled dev half out instead would either report
    every mode on half the problems (wider intervals, and numbers no longer comparable with pass@n and
    accuracy@1 over the whole benchmark) or report best_verifier alone on other problems; most benchmarks here
    (math500, gpqa_diamond) have no dev split at all. An oracle upper bound stays honest by being labelled one,
    and it is the bound the label-free selectors are judged against: beating the best single verifier even
    when it is known in hindsight."""
    n = sel.n
    c = np.asarray(correct, dtype=bool)
    if len(c) % n:
        raise ValueError(f"measure: {len(c)} outcomes are not groups of n={n}")
    groups = c.reshape(-1, n)
    n_prob = len(groups)
    k = f"@{n}"
    m: dict[str, float] = {}
    pass_k = [pass_at_k(n, int(g.sum()), n) for g in groups]
    ci = wilson_interval(sum(pass_k), n_prob)
    m[f"pass{k}_ci_low"], m[f"pass{k}_ci_high"] = ci.low, ci.high
    pass_mean = float(np.mean(pass_k)) if n_prob else 0.0

    def hits(picks: list[int]) -> list[bool]:
        return [bool(groups[i, j]) for i, j in enumerate(picks)]

    rows: list[VerifierRow] = []
    for name, vpicks in sel.verifier_picks.items():
        v = np.asarray(sel.votes[name], dtype=np.float64)
        rows.append(VerifierRow(
            name=name, status=f"dropped: {sel.dropped[name]}" if name in sel.dropped else "active",
            weaver_tpr=sel.weaver_metrics.get(f"weaver/{name}/tpr"),
            weaver_fpr=sel.weaver_metrics.get(f"weaver/{name}/fpr"),
            tpr=_rate(v, c), fpr=_rate(v, ~c), accuracy=float((v == c).mean()) if len(c) else 0.0,
            select_accuracy=float(np.mean(hits(vpicks))) if n_prob else 0.0))
    best = max(rows, key=lambda r: r.select_accuracy).name if rows else None  # max keeps the first on ties
    picks = dict(sel.picks)
    if "best_verifier" in sel.modes:
        if best is None:
            raise ValueError("selection=best_verifier: no verifier scores to choose from")
        picks["best_verifier"] = list(sel.verifier_picks[best])
    for mode in sel.modes:
        h = hits(picks[mode])
        acc = float(np.mean(h)) if n_prob else 0.0
        ci = wilson_interval(sum(h), n_prob)
        m[f"select/{mode}{k}"] = acc
        m[f"select/{mode}{k}/ci_low"], m[f"select/{mode}{k}/ci_high"] = ci.low, ci.high
        m[f"select/{mode}{k}/gap"] = pass_mean - acc
    if sel.weaver_metrics:
        for key in ("prior", "n_active", "fallback"):
            if f"weaver/{key}" in sel.weaver_metrics:
                m[f"select/weaver/{key}"] = float(sel.weaver_metrics[f"weaver/{key}"])
    for r in rows:
        for attr in ("weaver_tpr", "weaver_fpr", "tpr", "fpr", "accuracy"):
            val = getattr(r, attr)
            if val is not None:
                m[f"verifier/{r.name}/{attr}"] = float(val)
        m[f"verifier/{r.name}/select{k}"] = r.select_accuracy
        m[f"verifier/{r.name}/dropped"] = float(r.status != "active")
    return SelectionReport(n=n, modes=list(sel.modes), verifier_set=verifier_set, metrics=m, picks=picks,
                           verifiers=rows, best_verifier=best)


# --- one benchmark ---------------------------------------------------------------------------------------------
def apply(result: Any, selector: Selector, n: int) -> SelectionReport:
    """Select on a `BenchmarkResult` (its records are grouped per problem, `n` each), then measure: adds the
    selection metrics to `result.metrics`, the report to `result.selection`, and to each record's
    `extra["selection"]` its verifier scores, votes, posterior and the modes that picked it."""
    records = result.records
    problems = [p for p in result.problems for _ in range(n)]
    if len(problems) != len(records) or any(p.id != r.prompt_id for p, r in zip(problems, records)):
        raise RuntimeError(f"selection: {len(records)} records do not line up with {len(result.problems)} problems "
                           f"x n={n}")
    sel = selector.select(problems, [r.response for r in records], n)
    name = selector.verifier_set.name if selector.verifier_set is not None and selector.members else None
    report = measure(sel, [r.correct for r in records], verifier_set=name)
    picked: dict[int, list[str]] = {}
    for mode, picks in report.picks.items():
        for g, j in enumerate(picks):
            picked.setdefault(g * n + j, []).append(mode)
    for i, r in enumerate(records):
        extra: dict[str, Any] = {"picked_by": picked.get(i, [])}
        if sel.scores:
            extra["scores"] = {v: sel.scores[v][i] for v in sel.scores}
            extra["votes"] = {v: sel.votes[v][i] for v in sel.votes}
            extra["posterior"] = sel.posterior[i]
        r.extra["selection"] = extra
    result.metrics.update(report.metrics)
    result.selection = report
    return report

