"""What a `reward=weaver` step reports (rlexp/rewards/weaver.py's metrics), one concept apart from
the reward: the verifiers' rates and agreement, the label model's fit, and the signs that tell a
collapse or a fallback from learning. `reward/weaver_fallback` (1 when too few verifiers survived
the filters to fit the label model, so the reward is the unweighted mean) sits beside `reward/mean`,
where a dashboard looks first, and the controller's progress line says it in words
(rlexp/run/controller.py::weaver_fallback_warning)."""
from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from rlexp.types import Problem

if TYPE_CHECKING:
    from rlexp.rewards.weaver import WeaverReward


def step_metrics(r: WeaverReward, rewards: np.ndarray, votes: np.ndarray, win_votes: np.ndarray,
                 act: np.ndarray, fallback: float, group_size: int) -> dict[str, float]:
    m: dict[str, float] = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "weaver/n_active": float(act.sum()),
        "weaver/n_dropped": float((~act).sum()),
        "weaver/fallback": fallback,
        "reward/weaver_fallback": fallback,  # beside reward/mean, where a dashboard looks first
        "weaver/window_responses": float(len(win_votes)),
        "weaver/window_groups": float(len(r.window)),
        # Share of groups in which every response gets the same reward (zero GRPO advantage).
        "weaver/flat_group_frac": float(np.mean([np.ptp(rewards[g:g + group_size]) < 1e-9
                                                 for g in range(0, len(rewards), group_size)])),
    }
    if r.params is not None:
        m["weaver/prior"] = float(r.params.prior)
        m["weaver/em_iters"] = float(r.params.iters)
        m["weaver/loglik"] = float(r.params.loglik)
    active_idx = {n: j for j, n in enumerate(n for n, a in zip(r.names, act) if a)}
    weighted = (
        r.params is not None and r.opts.weighting != "posterior" and r.opts.combine == "label_model"
    )
    weights = r.score_weights() if weighted else None
    for i, name in enumerate(r.names):
        m[f"weaver/{name}/pos_rate"] = float(win_votes[:, i].mean())
        m[f"weaver/{name}/pos_rate_batch"] = float(votes[:, i].mean())
        m[f"weaver/{name}/dropped"] = float(name in r.dropped)
        if r.params is not None and name in active_idx:
            j = active_idx[name]
            m[f"weaver/{name}/tpr"] = float(r.params.tpr[j])
            m[f"weaver/{name}/fpr"] = float(r.params.fpr[j])
            m[f"weaver/{name}/acc"] = float(r.params.accuracy[j])
            if weights is not None and j < len(weights):
                m[f"weaver/{name}/weight"] = float(weights[j])
    for i in range(len(r.names)):
        for k in range(i + 1, len(r.names)):
            m[f"weaver/agree/{r.names[i]}__{r.names[k]}"] = float(
                (win_votes[:, i] == win_votes[:, k]).mean())
    return m

def paper_metrics(
    r: WeaverReward,
    problems: list[Problem],
    texts: list[str],
    model_rewards: np.ndarray,
    group_size: int,
    refit: bool,
    bounded: float,
) -> dict[str, float]:
    """What tells a collapse from learning: the label model's belief, the class balance it is held
    to, the dev budget spent, and how alike the policy answers (the share of each group's most
    common answer)."""
    prior = r.class_prior()
    m: dict[str, float] = {
        "weaver/est_correct_share": float(np.mean(model_rewards)) if len(model_rewards) else 0.0,
        "weaver/class_balance": float(prior if prior is not None else
                                      (r.params.prior if r.params is not None else math.nan)),
        "weaver/dev_labels": float(len(r.dev_labels)),
        "weaver/reference_groups": float(len(r.pool)),
        "weaver/refit": float(refit),
        "weaver/refit_bounded": bounded,
        "weaver/zero_adv_warn_at": float(r.opts.warn_zero_adv),
    }
    if r.opts.debias_answers:  # 0 until the pool fills; then the largest answer offset removed
        m["weaver/answer_offset_max"] = max((abs(x) for o in (r.offsets or {}).values() for x in o),
                                            default=0.0)
        m["weaver/answer_offsets_fixed"] = float(r.offsets is not None)
    if r.dev_labels:
        m["weaver/dev_correct_share"] = float(np.mean(r.dev_labels))
        for i, name in enumerate(r.names):
            if (dr := r.dev_rates(i)) is not None:
                m[f"weaver/{name}/dev_tpr"], m[f"weaver/{name}/dev_fpr"] = dr
    if r.opts.fit_thresholds:
        for i, name in enumerate(r.names):
            m[f"weaver/{name}/threshold"] = float(r.thresholds[i])
    if r.env is not None and hasattr(r.env, "extract"):
        shares = []
        for g in range(0, len(texts), group_size):
            answers = [
                r.env.extract(p, t)
                for p, t in zip(problems[g : g + group_size], texts[g : g + group_size])
            ]
            top = max(Counter(a for a in answers if a is not None).values(), default=0)
            shares.append(top / max(len(answers), 1))
        m["weaver/top_answer_share"] = float(np.mean(shares)) if shares else 0.0
    return {k: (v if math.isfinite(v) else -1.0) for k, v in m.items()}
