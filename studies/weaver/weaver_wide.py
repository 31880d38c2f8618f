"""Panel W without RL (issue 46 item 4; studies/weaver/preregistration.md addendum v14): does Weaver's label model
beat the mean and the vote where the paper says it should, with many heterogeneous, partly
correlated verifiers?

    python studies/weaver/weaver_wide.py --out studies/weaver/results/weaver_wide

On the starting policy's pool (as studies/weaver/weaver_label_diag.py builds it) and the held-out
best-of-10 candidates, for each dev budget and filter setting, the label model (weaver_paper), the
mean and the vote are run through `WeaverReward` itself on the same raw scores (computed once); the
figures and the criterion are the addendum's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from weaver_label_diag import (  # noqa: E402
    GROUP,
    NO_FILTERS,
    best_of_10,
    boot_pool,
    correct,
    group_auc,
    policy_pool,
    raw_scores,
    reward_options,
    score_in_rl_order,
)

from rlexp.rewards.verifiers.tiny_panels import WIDE_SET  # noqa: E402

BUDGETS = (16, 32, 64, 256)
FILTERS = {
    "registered": {},
    "none": NO_FILTERS,
    "no min_quality": {"min_quality": -1.0},
    "no max_imbalance": {"max_imbalance": 1.0},
    "no max_correlation": {"max_correlation": 1.0},
}
ARMS = {
    "weaver_paper": {},
    "verifier_mean": {"combine": "mean"},
    "verifier_vote": {"combine": "vote"},
}


def gather(seed: int) -> dict[str, Any]:
    from rlexp.config.environment import EnvConfig
    from rlexp.envs.registry import build_env

    env, pool_samples, pool_texts = policy_pool(seed)
    held = build_env(EnvConfig(name="arithmetic", options={"verifier_frac": 0.25})).eval_samples()
    cand_samples = [s for s in held for _ in range(10)]
    cand_texts = [str(d) for _ in held for d in range(10)]
    return {"env": env,
            "pool": {"prompts": [s.problem.prompt for s in pool_samples], "texts": pool_texts,
                     "gold": [s.answer for s in pool_samples],
                     "raw": raw_scores(WIDE_SET, env, pool_samples, pool_texts, GROUP)},
            "cand": {"prompts": [s.problem.prompt for s in cand_samples], "texts": cand_texts,
                     "gold": [s.answer for s in cand_samples],
                     "raw": raw_scores(WIDE_SET, env, cand_samples, cand_texts, 10)}}


def run(data: dict[str, Any], options: dict[str, Any]) -> tuple[Any, np.ndarray, np.ndarray]:
    """RL's order: two pool steps (dev labels, fit), the pool rescored by the fitted reward, then
    the candidates."""
    p, c = data["pool"], data["cand"]
    return score_in_rl_order(WIDE_SET, data["env"], p, c, p["raw"], c["raw"], options)


def study(data: dict[str, Any]) -> dict[str, Any]:
    paper = reward_options("weaver_paper")
    y = correct(data["pool"])
    cells: dict[str, Any] = {}
    for budget in BUDGETS:
        for fname, filt in FILTERS.items():
            cell: dict[str, Any] = {"budget": budget, "filters": fname, "arms": {}}
            rewards = {}
            for arm, change in ARMS.items():
                r, pool_r, cand_r = run(data, {**paper, **filt, **change, "dev_labels": budget})
                rewards[arm] = pool_r
                cell["arms"][arm] = {
                    "group_auc": group_auc(pool_r, y, GROUP),
                    "best_of_10_balanced": best_of_10(cand_r, data["cand"], boot=200)["balanced"],
                    "n_active": len(r.active),
                    "fallback": r.params is None and change == {},
                    "dropped": dict(r.dropped),
                }
            cell["paired"] = {
                b: boot_pool(rewards["weaver_paper"], rewards[b], y, GROUP)["group_auc"]
                for b in ("verifier_mean", "verifier_vote")
            }
            cell["label_model_wins"] = all(d["low"] > 0 for d in cell["paired"].values())
            cells[f"{budget}/{fname}"] = cell
            print(
                f"dev {budget} filters {fname}: "
                + ", ".join(f"{a} {v['group_auc']:.3f}" for a, v in cell["arms"].items())
                + f" | wins {cell['label_model_wins']}",
                flush=True,
            )
    return cells


def markdown(cells: dict[str, Any], command: str, pool_acc: float) -> str:
    L = [
        "# Panel W without RL: the label model against the mean and the vote (addendum v14)",
        "",
        f"Produced by `{command}`. Pool: the starting policy's samples (128 prompts x "
        f"16, {pool_acc:.3f} right); 22 model verifiers (A, D, E and four twins). Within-group "
        "AUC on the pool (GRPO's ranking), paired differences with a 95% bootstrap over "
        "groups; best-of-10 balanced accuracy on the held-out candidates.",
        "",
        "| dev labels | filters | active | fallback | AUC label model | mean | vote | LM - mean "
        "| LM - vote | best-of-10 LM / mean / vote | wins |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells.values():
        a, p = c["arms"], c["paired"]
        d = [
            f"{x['diff']:+.3f} [{x['low']:+.3f}, {x['high']:+.3f}]"
            for x in (p["verifier_mean"], p["verifier_vote"])
        ]
        L.append(
            f"| {c['budget']} | {c['filters']} | {a['weaver_paper']['n_active']} "
            f"| {'yes' if a['weaver_paper']['fallback'] else 'no'} "
            f"| {a['weaver_paper']['group_auc']:.3f} | {a['verifier_mean']['group_auc']:.3f} "
            f"| {a['verifier_vote']['group_auc']:.3f} | {d[0]} | {d[1]} | "
            + " / ".join(f"{a[k]['best_of_10_balanced']:.3f}" for k in ARMS)
            + f" | {'yes' if c['label_model_wins'] else 'no'} |"
        )
    reg = cells.get("256/registered")
    if reg:
        L += [
            "",
            "Criterion (addendum v14): an RL sweep on panel W is registered only if the label "
            "model wins at dev 256 with the registered filters: "
            f"**{'it does' if reg['label_model_wins'] else 'it does not'}**.",
        ]
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, required=True, help="output prefix: PREFIX.md and PREFIX.json"
    )
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    command = "python studies/weaver/weaver_wide.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    data = gather(a.seed)
    cells = study(data)
    pool_acc = float(correct(data["pool"]).mean())
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(
        json.dumps(
            {"command": command, "pool_accuracy": pool_acc, "cells": cells}, indent=1, default=str
        )
        + "\n"
    )
    text = markdown(cells, command, pool_acc)
    a.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
