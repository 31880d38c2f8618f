"""`reward=weaver`: combine several weak verifiers into P(correct | votes) without gold labels.

Per step: score the batch with every verifier; add the batch's groups to a sliding window of recent groups;
min-max normalise each verifier's scores over the window and binarise them at that verifier's threshold;
drop verifiers whose votes carry no signal (constant, or a positive rate outside the band); refit the
latent-class label model (rlexp/rewards/label_model.py) on the window's votes; reward each response with
its posterior. Refitting over a window (rather than once) follows the policy: as it improves, the class
prior rises and the kinds of mistakes -- hence each verifier's FPR -- change.

Gold isolation: `needs_gold = False`, so this class receives `Problem`s only (see rlexp/rewards/base.py).
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.rewards.base import Reward, plain, register_reward
from rlexp.rewards.label_model import BinaryLabelModel, LabelModelParams
from rlexp.rewards.verifiers.base import ServedVerifier, Verifier
from rlexp.rewards.verifiers.registry import build_verifier
from rlexp.types import Problem, RewardOutput

log = logging.getLogger(__name__)
STATE_VERSION = 1


@dataclass
class WeaverOptions:
    # Groups (one problem's responses each) the label model is refit on every step. ~1000+ responses keep
    # the estimated rates within a few points; far more makes the fit lag behind the policy.
    window_groups: int = 128
    # A verifier whose window positive rate is outside this open interval is dropped (Weaver uses (0.1, 0.9)).
    drop_band: tuple[float, float] = (0.05, 0.95)
    # Threshold on the min-max normalised score for verifiers that do not set options.threshold.
    threshold: float = 0.5
    # Below three informative verifiers the latent-class model is not identifiable; fall back to mean vote.
    min_active: int = 3
    # How the active verifiers' votes become a reward: label_model (Weaver: P(correct | votes) from the
    # latent-class model), mean (unweighted average of the normalised scores), vote (majority of the votes:
    # 1, 0.5 on a tie, 0). mean and vote are the baselines Weaver must beat, on the same verifiers.
    combine: str = "label_model"
    # Label model numerics (see BinaryLabelModel).
    eps: float = 1e-3
    smoothing: float = 0.5
    max_iter: int = 500
    tol: float = 1e-7

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> WeaverOptions:
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise ValueError(f"reward=weaver: unknown options {sorted(unknown)}; known: {sorted(known)}")
        o = cls(**options)
        o.drop_band = tuple(float(x) for x in o.drop_band)  # type: ignore[assignment]
        if len(o.drop_band) != 2 or not 0.0 <= o.drop_band[0] < o.drop_band[1] <= 1.0:
            raise ValueError("reward=weaver: drop_band must be (low, high) with 0 <= low < high <= 1, "
                             f"got {o.drop_band}")
        if o.combine not in ("label_model", "mean", "vote"):
            raise ValueError(f"reward=weaver: options.combine must be label_model|mean|vote, got {o.combine!r}")
        if o.window_groups < 1:
            raise ValueError(f"reward=weaver: window_groups must be >= 1, got {o.window_groups}")
        return o


@register_reward("weaver")
class WeaverReward(Reward):
    needs_gold = False

    def __init__(self, cfg: RewardConfig, env: Any, served: bool = True) -> None:
        super().__init__(cfg, env, served)
        self.opts = WeaverOptions.from_options(dict(plain(cfg.options) or {}))
        vcfgs = [VerifierConfig(**v) if isinstance(v, dict) else v for v in (plain(cfg.verifiers) or [])]
        if not vcfgs:
            raise ValueError("reward=weaver needs at least one entry in `verifiers` (kind: rule | reward_model | "
                             "lm_judge); see rlexp/conf/reward/weaver.yaml")
        self.verifiers: list[Verifier] = [build_verifier(v, env, served=served) for v in vcfgs]
        self.names = [v.name for v in self.verifiers]
        dup = {n for n in self.names if self.names.count(n) > 1}
        if dup:
            raise ValueError(f"reward=weaver: verifier names must be unique, repeated: {sorted(dup)}")
        self.thresholds = np.array([float((plain(v.options) or {}).get("threshold", self.opts.threshold))
                                    for v in vcfgs])
        self.label_model = BinaryLabelModel(eps=self.opts.eps, smoothing=self.opts.smoothing,
                                            max_iter=self.opts.max_iter, tol=self.opts.tol)
        self.window: deque[np.ndarray] = deque(maxlen=self.opts.window_groups)
        self.params: LabelModelParams | None = None
        self.active: list[str] = []
        # Verifiers the current `params` were fit on: a warm start is only valid for the same set.
        self.fit_names: list[str] = []
        self.dropped: dict[str, str] = {}
        self.steps = 0

    # --- scoring -----------------------------------------------------------------------------------
    def _score(self, problems: list[Problem], texts: list[str], group_size: int) -> RewardOutput:
        raw = self._verifier_scores(problems, texts)
        for g in range(0, len(texts), group_size):
            self.window.append(raw[g:g + group_size])
        win = np.concatenate(list(self.window), axis=0)
        lo, hi = win.min(axis=0), win.max(axis=0)
        win_votes = self._binarise(win, lo, hi)
        votes = self._binarise(raw, lo, hi)
        self._update_dropped(win_votes, lo, hi)
        act = np.array([n in self.active for n in self.names], dtype=bool)

        fallback = 0.0
        if self.opts.combine == "mean":
            span = np.where(hi > lo, hi - lo, 1.0)
            norm = np.where(hi > lo, (raw - lo) / span, 0.0)
            rewards = norm[:, act].mean(axis=1) if act.any() else np.full(len(texts), 0.5)
        elif self.opts.combine == "vote":
            share = votes[:, act].mean(axis=1) if act.any() else np.full(len(texts), 0.5)
            rewards = np.where(share > 0.5, 1.0, np.where(share < 0.5, 0.0, 0.5))
        elif act.sum() >= self.opts.min_active:
            warm = self.params if self.fit_names == self.active else None
            self.params = self.label_model.fit(win_votes[:, act], warm=warm)
            self.fit_names = list(self.active)
            rewards = self.label_model.posterior(votes[:, act], self.params)
        else:
            self.params, self.fit_names = None, []
            fallback = 1.0
            rewards = votes[:, act].mean(axis=1) if act.any() else np.full(len(texts), 0.5)
        self.steps += 1
        metrics = self._metrics(rewards, votes, win_votes, act, fallback, group_size)
        details = [{"scores": dict(zip(self.names, map(float, raw[i]))),
                    "votes": dict(zip(self.names, map(int, votes[i]))),
                    "posterior": float(rewards[i])} for i in range(len(texts))]
        return RewardOutput(rewards=[float(r) for r in rewards], metrics=metrics, details=details)

    def _verifier_scores(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        # Served models first: their services score concurrently while the local checks run here.
        started = {v.name: v.start(problems, texts) for v in self.verifiers if isinstance(v, ServedVerifier)}
        cols = []
        for v in self.verifiers:
            s = np.asarray(started[v.name].get() if v.name in started else v.score(problems, texts), dtype=np.float64)
            if s.shape != (len(texts),) or not np.isfinite(s).all():
                raise RuntimeError(f"weaver: verifier {v.name!r} returned {s.shape} scores (non-finite: "
                                   f"{int((~np.isfinite(s)).sum()) if s.ndim else '?'}) for {len(texts)} responses")
            cols.append(s)
        return np.stack(cols, axis=1)

    def _binarise(self, scores: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        span = hi - lo
        norm = np.where(span > 0, (scores - lo) / np.where(span > 0, span, 1.0), 0.0)
        return (norm >= self.thresholds).astype(np.float64)

    def _update_dropped(self, win_votes: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        band_lo, band_hi = self.opts.drop_band
        dropped: dict[str, str] = {}
        for i, name in enumerate(self.names):
            rate = float(win_votes[:, i].mean())
            if hi[i] <= lo[i]:
                dropped[name] = f"constant score {lo[i]:.4g} over the window (no signal)"
            elif not band_lo < rate < band_hi:
                dropped[name] = (f"positive rate {rate:.3f} outside ({band_lo}, {band_hi}) over "
                                 f"{len(win_votes)} responses (no signal)")
        for name, why in dropped.items():
            if name not in self.dropped:
                log.warning("weaver: dropping verifier %r: %s", name, why)
        for name in set(self.dropped) - set(dropped):
            log.info("weaver: verifier %r is back in (positive rate inside the band)", name)
        self.dropped = dropped
        self.active = [n for n in self.names if n not in dropped]

    def _metrics(self, rewards: np.ndarray, votes: np.ndarray, win_votes: np.ndarray, act: np.ndarray,
                 fallback: float, group_size: int) -> dict[str, float]:
        m: dict[str, float] = {
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std()),
            "weaver/n_active": float(act.sum()),
            "weaver/n_dropped": float((~act).sum()),
            "weaver/fallback": fallback,
            "weaver/window_responses": float(len(win_votes)),
            "weaver/window_groups": float(len(self.window)),
            # Share of groups in which every response gets the same reward (zero GRPO advantage).
            "weaver/flat_group_frac": float(np.mean([np.ptp(rewards[g:g + group_size]) < 1e-9
                                                     for g in range(0, len(rewards), group_size)])),
        }
        if self.params is not None:
            m["weaver/prior"] = float(self.params.prior)
            m["weaver/em_iters"] = float(self.params.iters)
            m["weaver/loglik"] = float(self.params.loglik)
        active_idx = {n: j for j, n in enumerate(n for n, a in zip(self.names, act) if a)}
        for i, name in enumerate(self.names):
            m[f"weaver/{name}/pos_rate"] = float(win_votes[:, i].mean())
            m[f"weaver/{name}/pos_rate_batch"] = float(votes[:, i].mean())
            m[f"weaver/{name}/dropped"] = float(name in self.dropped)
            if self.params is not None and name in active_idx:
                j = active_idx[name]
                m[f"weaver/{name}/tpr"] = float(self.params.tpr[j])
                m[f"weaver/{name}/fpr"] = float(self.params.fpr[j])
                m[f"weaver/{name}/acc"] = float(self.params.accuracy[j])
        for i in range(len(self.names)):
            for k in range(i + 1, len(self.names)):
                m[f"weaver/agree/{self.names[i]}__{self.names[k]}"] = float(
                    (win_votes[:, i] == win_votes[:, k]).mean())
        return m

    # --- checkpointing -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "verifiers": list(self.names),
            "window": [g.tolist() for g in self.window],
            "params": self.params.to_dict() if self.params is not None else None,
            "active": list(self.active),
            "fit_names": list(self.fit_names),
            "dropped": dict(self.dropped),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"weaver: checkpoint state version {state.get('version')} != {STATE_VERSION}")
        if list(state["verifiers"]) != self.names:
            raise ValueError(f"weaver: checkpoint was saved with verifiers {state['verifiers']} but the config has "
                             f"{self.names}; resume with the same reward.verifiers")
        m = len(self.names)
        self.window = deque((np.asarray(g, dtype=np.float64).reshape(-1, m) for g in state["window"]),
                            maxlen=self.opts.window_groups)
        self.params = LabelModelParams.from_dict(state["params"]) if state.get("params") else None
        self.active = list(state.get("active", []))
        self.fit_names = list(state.get("fit_names", []))
        self.dropped = dict(state.get("dropped", {}))
        self.steps = int(state.get("steps", 0))
