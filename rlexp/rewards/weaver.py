"""`reward=weaver`: combine several weak verifiers into P(correct | votes), label-free or the paper's way.

Two regimes, one class (options in `WeaverOptions`, rlexp/rewards/weaver_options.py; what a step logs in
rlexp/rewards/weaver_metrics.py; rlexp/conf/reward/weaver.yaml is the label-free one,
rlexp/conf/reward/weaver_paper.yaml the paper's):

* label-free online (`reference_groups: 0`, the defaults): per step, add the batch's groups to a sliding
  window, min-max normalise each verifier over it, binarise at a fixed threshold, drop verifiers without signal,
  refit the latent-class model (rlexp/rewards/label_model.py) with a free class balance, reward the posterior.
  It follows the policy, which is also how it fails in RL: the policy's own optimised outputs set the class
  balance, so a collapsed policy whose answers the verifiers agree on reads as "mostly right"
  (results/weaver_replication.md).
* the paper's way (Weaver, Saad-Falcon et al. 2025; `reference_groups > 0`): the first `reference_groups` groups
  (the starting policy's samples) are a fixed reference pool; the class balance comes from a budget of
  gold-labelled responses among them (`class_balance: dev`, `dev_labels`, handed over by
  `rlexp.rewards.base.Reward.receive_labels`, counted and logged) or is stated (`class_balance: prior`);
  scores are quantile-normalised over the pool and each verifier is thresholded where its positive rate on
  the pool equals the class balance; verifiers are filtered by estimated quality (TPR - FPR), by imbalance
  against the class balance and by correlation with a better one; the label model is fit on the pool with the
  class balance fixed and afterwards refit only every `refit_every` steps, each rate moving at most
  `max_change` per refit (a larger wanted move is logged).

Either way `majority` and `format` (which reward agreement and readability, not correctness) can be kept out of
the label model: `majority_as` / `format_as` make them a gate (reward x vote), a separate term, or nothing.

Gold isolation: `needs_gold = False`, so this class receives `Problem`s only (see rlexp/rewards/base.py); the dev
labels are correctness bits for the responses it asked for, never answers.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any

import numpy as np

from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.errors import UserCodeError
from rlexp.rewards.base import Reward, plain, register_reward
from rlexp.rewards.crossing import clip
from rlexp.rewards.label_model import BinaryLabelModel, LabelModelParams
from rlexp.rewards.verifiers.base import ServedVerifier, Verifier
from rlexp.rewards.verifiers.kinds import VERIFIER_KINDS
from rlexp.rewards.verifiers.registry import build_verifier
from rlexp.rewards.weaver_metrics import paper_metrics, step_metrics
from rlexp.rewards.weaver_options import WeaverOptions, balance_threshold
from rlexp.types import Problem, RewardOutput

log = logging.getLogger(__name__)
STATE_VERSION = 2
# Verifier kinds that measure agreement or readability rather than correctness: the roles they may take.
SEPARABLE_KINDS = tuple(VERIFIER_KINDS.having("separable"))  # as declared (verifiers/kinds.py)


@register_reward("weaver")
class WeaverReward(Reward):
    needs_gold = False

    def __init__(self, cfg: RewardConfig, env: Any, served: bool = True) -> None:
        super().__init__(cfg, env, served)
        self.opts = WeaverOptions.from_options(dict(plain(cfg.options) or {}))
        if self.opts.combine == "label_model":
            log.info("weaver: the label model's output is %s (options.weighting)", {
                "posterior": "P(correct | binary votes)", "quality": "a mean of the normalised scores weighted by "
                "the estimated TPR - FPR", "logodds": "a mean of the normalised scores weighted by the estimated "
                "logit(TPR) - logit(FPR)"}[self.opts.weighting])
        vcfgs = [VerifierConfig(**v) if isinstance(v, dict) else v for v in (plain(cfg.verifiers) or [])]
        if not vcfgs:
            raise ValueError("reward=weaver needs at least one entry in `verifiers` (kind: rule | reward_model | "
                             "lm_judge); see rlexp/conf/reward/weaver.yaml")
        self.verifiers: list[Verifier] = [build_verifier(v, env, served=served) for v in vcfgs]
        self.names = [v.name for v in self.verifiers]
        dup = {n for n in self.names if self.names.count(n) > 1}
        if dup:
            raise ValueError(f"reward=weaver: verifier names must be unique, repeated: {sorted(dup)}")
        self.given_thresholds = np.array([float((plain(v.options) or {}).get("threshold", self.opts.threshold))
                                          for v in vcfgs])
        self.thresholds = self.given_thresholds.copy()
        roles = {"majority": self.opts.majority_as, "format": self.opts.format_as}
        self.roles = [roles.get(str(v.kind), "model") for v in vcfgs]
        self.label_model = BinaryLabelModel(eps=self.opts.eps, smoothing=self.opts.smoothing,
                                            max_iter=self.opts.max_iter, tol=self.opts.tol)
        self.window: deque[np.ndarray] = deque(maxlen=self.opts.window_groups)
        self.pool: list[np.ndarray] = []  # the reference pool's groups (reference_groups > 0)
        self.params: LabelModelParams | None = None
        self.active: list[str] = []
        # Verifiers the current `params` were fit on: a warm start is only valid for the same set.
        self.fit_names: list[str] = []
        self.dropped: dict[str, str] = {}
        self.steps = 0
        self.dev_scores: list[list[float]] = []  # raw scores of the gold-labelled responses (class_balance=dev)
        self.dev_labels: list[bool] = []
        self.dev_rows: list[int] = []  # each dev response's row in the pool (the pool's groups laid end to end)
        self.pending: dict[int, bool] = {}  # labels handed over for the batch being scored
        # debias_answers: the extracted answer of each pool row and dev row, and the per-answer offsets
        # (answer -> one offset per verifier) fixed when the pool fills.
        self.pool_keys: list[str] = []
        self.dev_keys: list[str] = []
        self.offsets: dict[str, list[float]] | None = None
        self.since_refit = 0
        self.fallback_warned = False  # the label-model fallback is announced once per run (_warn_fallback)

    # --- the labelled dev budget (rlexp.rewards.base.Reward.label_request) ---------------------------------
    def label_request(self, n: int, group_size: int) -> list[int]:
        left = self.opts.dev_labels - len(self.dev_labels) if self.opts.class_balance == "dev" else 0
        if left <= 0 or n == 0 or self.pool_full:
            return []
        # Only responses that enter the pool: on the step that fills it, the batch's later groups do not, and a
        # label of one of them would describe a response the fit never sees.
        n = min(n, (self.opts.reference_groups - len(self.pool)) * group_size)
        k = min(left, n)
        return sorted({int(i) for i in np.linspace(0, n - 1, k)})  # spread over the pool's new groups

    def receive_labels(self, labels: dict[int, bool]) -> None:
        self.pending = dict(labels)

    @property
    def reference(self) -> bool:
        return self.opts.reference_groups > 0

    @property
    def pool_full(self) -> bool:
        return self.reference and len(self.pool) >= self.opts.reference_groups

    # --- scoring -----------------------------------------------------------------------------------
    def _score(self, problems: list[Problem], texts: list[str], group_size: int) -> RewardOutput:
        raw = self._verifier_scores(problems, texts)
        keys = [self.env.extract(p, t) or "" for p, t in zip(problems, texts)] if self.opts.debias_answers else []
        if self.offsets is not None:
            raw = raw - self._offset_rows(keys)
        pool_rows = sum(len(g) for g in self.pool)  # labels are only requested for responses entering the pool
        for i, label in sorted(self.pending.items()):
            self.dev_scores.append([float(x) for x in raw[i]])
            self.dev_labels.append(bool(label))
            self.dev_rows.append(pool_rows + i)
            if keys:
                self.dev_keys.append(keys[i])
        self.pending = {}
        groups = [raw[g:g + group_size] for g in range(0, len(texts), group_size)]
        refit = True
        if not self.reference:
            self.window.extend(groups)
            fit_rows = base_rows = np.concatenate(list(self.window), axis=0)
        elif not self.pool_full:  # still collecting the starting policy's samples: fit on what is there
            entering = groups[:self.opts.reference_groups - len(self.pool)]
            self.pool.extend(entering)
            self.pool_keys += keys[:sum(len(g) for g in entering)]
            if self.opts.debias_answers and self.pool_full:
                raw = self._fix_offsets(raw, keys)
            fit_rows = base_rows = np.concatenate(self.pool, axis=0)
        else:
            self.window.extend(groups)
            self.since_refit += 1
            refit = bool(self.opts.refit_every) and self.since_refit % self.opts.refit_every == 0
            base_rows = np.concatenate(self.pool, axis=0)
            fit_rows = np.concatenate(self.pool + list(self.window), axis=0)
        norm_of = self._normaliser(base_rows)
        model = np.array([r == "model" for r in self.roles])
        bounded = 0.0
        if refit:
            prior = self.class_prior()
            if self.opts.fit_thresholds and prior is not None:
                base_norm = norm_of(base_rows)
                self.thresholds = np.where(model, [balance_threshold(base_norm[:, i], prior)
                                                   for i in range(len(self.names))], self.given_thresholds)
            fit_votes = self._binarise(norm_of(fit_rows))
            self._update_dropped(fit_votes, fit_rows, prior)
        act = np.array([n in self.active for n in self.names], dtype=bool)
        norm = norm_of(raw)
        votes = self._binarise(norm)

        fallback = 0.0
        if self.opts.combine == "mean":
            rewards = norm[:, act].mean(axis=1) if act.any() else np.full(len(texts), 0.5)
        elif self.opts.combine == "vote":
            share = votes[:, act].mean(axis=1) if act.any() else np.full(len(texts), 0.5)
            rewards = np.where(share > 0.5, 1.0, np.where(share < 0.5, 0.0, 0.5))
        elif act.sum() >= self.opts.min_active:
            if refit or self.fit_names != self.active:
                bounded = self._fit(*self._split_dev(self._binarise(norm_of(fit_rows))[:, act]))
            if self.opts.weighting == "posterior":
                rewards = self.label_model.posterior(votes[:, act], self.params)  # type: ignore[arg-type]
            else:
                w = self.score_weights()
                rewards = norm[:, act] @ w / w.sum()
        else:
            self.params, self.fit_names = None, []
            fallback = 1.0
            self._warn_fallback(int(act.sum()))
            # Too few verifiers to fit: the unweighted version of what the model would output (equal weights on
            # the scores for the weighted variants, the share of yes votes for the posterior).
            source = votes if self.opts.weighting == "posterior" else norm
            rewards = source[:, act].mean(axis=1) if act.any() else np.full(len(texts), 0.5)
        model_rewards = rewards
        rewards = self._apply_separate(rewards, votes)
        self.steps += 1
        win_votes = self._binarise(norm_of(fit_rows))
        metrics = step_metrics(self, rewards, votes, win_votes, act, fallback, group_size)
        metrics.update(paper_metrics(self, problems, texts, model_rewards, group_size, refit, bounded))
        details = [{"scores": dict(zip(self.names, map(float, raw[i]))),
                    "votes": dict(zip(self.names, map(int, votes[i]))),
                    "posterior": float(rewards[i])} for i in range(len(texts))]
        return RewardOutput(rewards=[float(r) for r in rewards], metrics=metrics, details=details)

    def class_prior(self) -> float | None:
        """The share of correct responses the label model is held to, or None when it estimates it; within the label
        model's own bounds, so the thresholds, the imbalance filter, the logged `weaver/class_balance` and the model
        use one number (0 correct of 256 dev labels would otherwise give 0.004 here and 0.01 in the model)."""
        if self.opts.class_balance == "prior":
            share = float(self.opts.prior)
        elif self.opts.class_balance == "dev" and self.dev_labels:
            share = (sum(self.dev_labels) + 1.0) / (len(self.dev_labels) + 2.0)  # Laplace: never exactly 0 or 1
        else:
            return None
        return float(np.clip(share, *self.label_model.prior_bounds))

    def score_weights(self) -> np.ndarray:
        """The weights `weighting=quality|logodds` puts on the active verifiers' normalised scores, from the label
        model's estimated TPR / FPR (no gold beyond what fixed its class balance). A verifier the model finds no
        better than chance gets weight 0 rather than a negative one, so the reward stays a mean in [0, 1]; if the
        model finds none better than chance, every verifier gets the same weight (the plain mean)."""
        assert self.params is not None
        tpr, fpr = self.label_model._clip(self.params.tpr), self.label_model._clip(self.params.fpr)
        logit = np.log(tpr / (1 - tpr)) - np.log(fpr / (1 - fpr))
        w = np.clip(tpr - fpr if self.opts.weighting == "quality" else logit, 0.0, None)
        return w if w.sum() > 0 else np.ones_like(w)

    def _split_dev(self, fit_votes: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """With dev_in_fit, the dev responses' rows (the pool comes first in the fit rows) leave the unlabelled
        votes and come back with their labels; otherwise every row is unlabelled."""
        if not (self.opts.dev_in_fit and self.dev_informative and self.dev_rows):
            return fit_votes, None
        idx = np.asarray(self.dev_rows)
        unlabelled = np.ones(len(fit_votes), dtype=bool)
        unlabelled[idx] = False
        return fit_votes[unlabelled], (fit_votes[idx], np.asarray(self.dev_labels, dtype=np.float64))

    def _fit(self, fit_votes: np.ndarray, labelled: tuple[np.ndarray, np.ndarray] | None = None) -> float:
        """Fit the label model on the active verifiers' votes; after the reference pool, bound each move.
        Returns 1.0 when a refit wanted to move the prior or a rate by more than `max_change`.

        The bound holds per verifier by name, so a refit that also changes the active set (a verifier dropped or
        back in) cannot jump the rates of the ones that stayed; a verifier new to the fit starts where the fit
        puts it."""
        same = self.fit_names == self.active
        old = self.params
        new = self.label_model.fit(fit_votes, warm=old if same else None, prior=self.class_prior(), labelled=labelled)
        bounded = 0.0
        if self.pool_full and old is not None and self.since_refit > 0:
            c = self.opts.max_change
            was = {n: j for j, n in enumerate(self.fit_names)}
            tpr, fpr = new.tpr.copy(), new.fpr.copy()
            moves = {"prior": new.prior - old.prior}
            for j, name in enumerate(self.active):
                if name in was:
                    k = was[name]
                    moves[f"{name}/tpr"], moves[f"{name}/fpr"] = tpr[j] - old.tpr[k], fpr[j] - old.fpr[k]
                    tpr[j] = old.tpr[k] + np.clip(tpr[j] - old.tpr[k], -c, c)
                    fpr[j] = old.fpr[k] + np.clip(fpr[j] - old.fpr[k], -c, c)
            big = {k: v for k, v in moves.items() if abs(v) > c}
            if big:
                bounded = 1.0
                log.warning("weaver: refit at step %d wanted to move %s; each is bounded to +-%.3g per refit",
                            self.steps + 1, ", ".join(f"{k} by {v:+.3f}" for k, v in sorted(big.items())), c)
            new = LabelModelParams(prior=float(old.prior + np.clip(new.prior - old.prior, -c, c)), tpr=tpr, fpr=fpr,
                                   loglik=new.loglik, iters=new.iters, init=new.init)
        self.params, self.fit_names = new, list(self.active)
        if self.opts.weighting != "posterior" and self.opts.combine == "label_model":
            log.info("weaver: weights on the normalised scores (weighting=%s): %s", self.opts.weighting,
                     {n: round(float(x), 3) for n, x in zip(self.active, self.score_weights())})
        return bounded

    def _apply_separate(self, rewards: np.ndarray, votes: np.ndarray) -> np.ndarray:
        """Majority and format outside the label model: gates multiply, terms mix in with `term_weight`."""
        for i, role in enumerate(self.roles):
            if role == "gate":
                rewards = rewards * votes[:, i]
        terms = [i for i, r in enumerate(self.roles) if r == "term"]
        if terms:
            w = self.opts.term_weight
            rewards = (1.0 - w) * rewards + w * votes[:, terms].mean(axis=1)
        return rewards

    def _warn_fallback(self, n_active: int) -> None:
        """Once per run, loudly: the label model is not fit and this reward is the unweighted mean, so an arm
        called Weaver is measuring the mean (issue 46). Names every dropped verifier and the filter that dropped
        it, so the fix (a filter's threshold, another verifier) is in the message."""
        if self.fallback_warned:
            return
        self.fallback_warned = True
        why = "; ".join(f"{n}: {r}" for n, r in self.dropped.items()) or "none dropped"
        log.warning("weaver: LABEL MODEL FALLBACK: %d active verifier(s) (%s) below min_active %d, so the reward is "
                    "the unweighted mean of the active ones, not Weaver (metric reward/weaver_fallback = 1). "
                    "Dropped: %s. Loosen the filter that dropped them (min_quality, max_imbalance, "
                    "max_correlation) or add verifiers.", n_active, ", ".join(self.active) or "none",
                    self.opts.min_active, why)

    def _offset_rows(self, keys: list[str]) -> np.ndarray:
        assert self.offsets is not None
        zero = [0.0] * len(self.names)
        return np.array([self.offsets.get(k, zero) for k in keys], dtype=np.float64).reshape(len(keys), -1)

    def _fix_offsets(self, raw: np.ndarray, keys: list[str]) -> np.ndarray:
        """The pool just filled: measure each answer's offset on it (answers seen fewer than 8 times get none),
        then move the pool, the dev rows and this batch onto the debiased scale. Returns the batch's rows."""
        rows = np.concatenate(self.pool, axis=0)
        model = np.array([r == "model" for r in self.roles])
        k = np.array(self.pool_keys)
        self.offsets = {}
        for key in sorted(set(self.pool_keys)):
            sel = k == key
            if sel.sum() >= 8:
                self.offsets[key] = [float(x) for x in np.where(model, rows[sel].mean(0) - rows.mean(0), 0.0)]
        sizes = np.cumsum([len(g) for g in self.pool])[:-1]
        self.pool = list(np.split(rows - self._offset_rows(self.pool_keys), sizes))
        if self.dev_scores:
            self.dev_scores = (np.array(self.dev_scores) - self._offset_rows(self.dev_keys)).tolist()
        log.info("weaver: per-answer offsets fixed on %d pool responses: %s", len(rows),
                 {a: round(max(o, key=abs), 3) for a, o in self.offsets.items()})
        return raw - self._offset_rows(keys)

    def _verifier_scores(self, problems: list[Problem], texts: list[str]) -> np.ndarray:
        # Served models first: their services score concurrently while the local checks run here.
        started = {v.name: v.start(problems, texts) for v in self.verifiers if isinstance(v, ServedVerifier)}
        cols = []
        for v in self.verifiers:
            s = np.asarray(started[v.name].get() if v.name in started else v.score(problems, texts), dtype=np.float64)
            if s.shape != (len(texts),):
                raise UserCodeError(f"weaver: verifier {v.name!r} returned {s.shape} scores for "
                                    f"{len(texts)} responses; a verifier scores each response once")
            if not np.isfinite(s).all():  # the verifier, response and value, where it crosses
                i, n = int(np.flatnonzero(~np.isfinite(s))[0]), int((~np.isfinite(s)).sum())
                raise UserCodeError(
                    f"weaver: verifier {v.name!r} returned {float(s[i])!r} for prompt "
                    f"{clip(problems[i].prompt, 60)}, response {clip(texts[i])} ({n} non-finite of "
                    f"{len(texts)}); a verifier score must be a finite number: fix the verifier")
            cols.append(s)
        return np.stack(cols, axis=1)

    def _normaliser(self, base: np.ndarray) -> Any:
        """Scores -> [0, 1] per verifier, from `base` (the window, or the reference pool): min-max, or the
        share of `base` at or below the score (quantile). Majority and format kept apart stay 0/1."""
        keep = np.array([r != "model" for r in self.roles])
        if self.opts.normalise == "quantile":
            cols = [np.sort(base[:, i]) for i in range(base.shape[1])]

            def norm(x: np.ndarray) -> np.ndarray:
                q = np.stack([np.searchsorted(c, x[:, i], side="right") / len(c) for i, c in enumerate(cols)], axis=1)
                return np.where(keep, x, q)
            return norm
        lo, hi = base.min(axis=0), base.max(axis=0)
        span = hi - lo

        def minmax(x: np.ndarray) -> np.ndarray:
            out = np.where(span > 0, (x - lo) / np.where(span > 0, span, 1.0), 0.0)
            return np.where(keep & (span <= 0), x, out) if keep.any() else out
        minmax.lo, minmax.hi = lo, hi  # type: ignore[attr-defined]
        return minmax

    def _binarise(self, norm: np.ndarray) -> np.ndarray:
        return (norm >= self.thresholds).astype(np.float64)

    @property
    def dev_informative(self) -> bool:
        """Dev labels of both classes: only then do they give each verifier a TPR and an FPR."""
        return any(self.dev_labels) and not all(self.dev_labels)

    def dev_rates(self, i: int) -> tuple[float, float] | None:
        """(TPR, FPR) of verifier i on the gold-labelled dev responses, with its current threshold."""
        if not self.dev_informative:
            return None
        y = np.array(self.dev_labels)
        rows = np.array(self.dev_scores)
        base = np.concatenate(self.pool, axis=0) if self.pool else rows
        v = self._binarise(self._normaliser(base)(rows))[:, i]
        return float(v[y].mean()), float(v[~y].mean())

    def _update_dropped(self, win_votes: np.ndarray, win_raw: np.ndarray, prior: float | None) -> None:
        band_lo, band_hi = self.opts.drop_band
        dropped: dict[str, str] = {}
        for i, name in enumerate(self.names):
            rate = float(win_votes[:, i].mean())
            if self.roles[i] != "model":
                dropped[name] = f"kept out of the label model ({self.roles[i]})"
            elif np.ptp(win_raw[:, i]) <= 0:
                dropped[name] = f"constant score {win_raw[0, i]:.4g} over the window (no signal)"
            elif prior is None and not band_lo < rate < band_hi:  # a known class balance: imbalance below
                dropped[name] = (f"positive rate {rate:.3f} outside ({band_lo}, {band_hi}) over "
                                 f"{len(win_votes)} responses (no signal)")
            elif prior is not None and abs(rate - prior) > self.opts.max_imbalance:
                dropped[name] = (f"positive rate {rate:.3f} is {abs(rate - prior):.3f} from the class balance "
                                 f"{prior:.3f} (max_imbalance {self.opts.max_imbalance})")
            elif (dr := self.dev_rates(i)) is not None and dr[0] - dr[1] < self.opts.min_quality:
                dropped[name] = (f"TPR - FPR {dr[0] - dr[1]:.3f} on {len(self.dev_labels)} labelled responses is "
                                 f"below min_quality {self.opts.min_quality}")
        if self.opts.max_correlation < 1.0:
            keep = [i for i, n in enumerate(self.names) if n not in dropped]
            quality = {i: (dr[0] - dr[1]) if (dr := self.dev_rates(i)) is not None else 0.0 for i in keep}
            for a in keep:
                for b in keep:
                    if b <= a or self.names[a] in dropped or self.names[b] in dropped:
                        continue
                    va, vb = win_votes[:, a], win_votes[:, b]
                    if va.std() == 0 or vb.std() == 0:
                        continue
                    r = float(np.corrcoef(va, vb)[0, 1])
                    if r > self.opts.max_correlation:
                        weak, strong = (b, a) if quality[a] >= quality[b] else (a, b)
                        dropped[self.names[weak]] = (f"votes correlate {r:.3f} with {self.names[strong]!r}'s "
                                                     f"(max_correlation {self.opts.max_correlation})")
        for name, why in dropped.items():
            if name not in self.dropped:
                log.warning("weaver: dropping verifier %r: %s", name, why)
        for name in set(self.dropped) - set(dropped):
            log.info("weaver: verifier %r is back in (positive rate inside the band)", name)
        self.dropped = dropped
        self.active = [n for n in self.names if n not in dropped]
        if self.opts.min_quality > -1.0 and not self.dev_informative:  # judge quality by the fit
            act = [i for i, n in enumerate(self.names) if n in self.active]
            if len(act) >= self.opts.min_active:
                fit = self.label_model.fit(win_votes[:, act], prior=prior)
                for j, i in enumerate(act):
                    q = float(fit.tpr[j] - fit.fpr[j])
                    if q < self.opts.min_quality:
                        why = f"estimated TPR - FPR {q:.3f} below min_quality {self.opts.min_quality}"
                        if self.names[i] not in self.dropped:
                            log.warning("weaver: dropping verifier %r: %s", self.names[i], why)
                        self.dropped[self.names[i]] = why
                self.active = [n for n in self.names if n not in self.dropped]

    # --- checkpointing -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "pool": [g.tolist() for g in self.pool],
            "dev_scores": [list(r) for r in self.dev_scores],
            "dev_labels": [bool(x) for x in self.dev_labels],
            "dev_rows": list(self.dev_rows),
            "thresholds": [float(x) for x in self.thresholds],
            "since_refit": self.since_refit,
            "verifiers": list(self.names),
            "window": [g.tolist() for g in self.window],
            "params": self.params.to_dict() if self.params is not None else None,
            "active": list(self.active),
            "fit_names": list(self.fit_names),
            "dropped": dict(self.dropped),
            "steps": self.steps,
            "pool_keys": list(self.pool_keys),
            "dev_keys": list(self.dev_keys),
            "offsets": self.offsets,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") not in (1, STATE_VERSION):  # version 1: before the reference pool, same fields
            raise ValueError(f"weaver: checkpoint state version {state.get('version')} is not 1 or {STATE_VERSION}")
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
        self.pool = [np.asarray(g, dtype=np.float64).reshape(-1, m) for g in state.get("pool", [])]
        self.dev_scores = [list(map(float, r)) for r in state.get("dev_scores", [])]
        self.dev_labels = [bool(x) for x in state.get("dev_labels", [])]
        self.dev_rows = [int(x) for x in state.get("dev_rows", [])]
        rows = sum(len(g) for g in self.pool)
        fits = len(self.dev_rows) == len(self.dev_labels) and all(0 <= i < rows for i in self.dev_rows)
        if self.dev_rows and not fits:
            raise ValueError(f"weaver: checkpoint state has {len(self.dev_rows)} dev rows for {len(self.dev_labels)} "
                             f"dev labels in a pool of {rows} responses; it is not one this reward wrote: resume from "
                             f"another checkpoint or start the run again")
        self.thresholds = np.asarray(state.get("thresholds", self.given_thresholds), dtype=np.float64)
        self.since_refit = int(state.get("since_refit", 0))
        self.pool_keys = [str(k) for k in state.get("pool_keys", [])]
        self.dev_keys = [str(k) for k in state.get("dev_keys", [])]
        off = state.get("offsets")
        self.offsets = {str(k): [float(x) for x in v] for k, v in off.items()} if off is not None else None
