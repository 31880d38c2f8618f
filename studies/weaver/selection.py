"""Test-time selection on every panel (A-E and W) with weaver_paper, and paired tests between the modes.

    nice -n 10 python studies/weaver/selection.py --out studies/weaver/results/selection

Issue 46 item 6, as studies/weaver/preregistration.md addendum v15 fixes it: the 1008 committed
held-out responses of studies/weaver/results/weaver_eval_selection/a (126 prompts x 8, a
gold-trained policy), the same on every panel;
each mode picks one response per prompt without gold; gold only scores the picks. weaver_paper, the
mean and the vote are fit as at the start of RL (the starting policy's pool and its 256 dev labels,
studies/weaver/weaver_label_diag.py),
the label-free weaver on the responses themselves (as `rlexp eval selection=weaver`). Paired tests
over prompts: a paired bootstrap (primary) and the exact sign test with Holm's correction (beside
it).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for _p in (REPO, HERE):  # rlexp and the study's helpers
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

SAMPLES = HERE / "results" / "weaver_eval_selection" / "a" / "samples_arithmetic_heldout.jsonl"
N = 8  # responses per prompt in SAMPLES
N_BOOT, BOOT_SEED = 10_000, 0
FIT_AT_START = {
    "weaver_paper": {},
    "verifier_mean": {"combine": "mean"},
    "verifier_vote": {"combine": "vote"},
}
MODES = (
    "weaver_paper",
    "verifier_mean",
    "verifier_vote",
    "weaver",
    "single_rm_debiased",
    "single_rm",
    "majority",
    "best_verifier",
)
# chosen with gold on the same prompts: an upper bound for one verifier, not a selector
ORACLE = "best_verifier"
HAND = "## What the numbers say"  # the results file's hand-written part starts here


def load_samples(path: Path = SAMPLES) -> dict[str, Any]:
    """The committed responses, checked to be whole groups of N per prompt in order (what `picks`
    assumes)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if len(rows) % N or any(
        r["sample_index"] != i % N or r["prompt_id"] != rows[i - i % N]["prompt_id"]
        for i, r in enumerate(rows)
    ):
        raise SystemExit(
            f"{path}: expected consecutive groups of {N} responses per prompt (sample_index "
            f"0..{N - 1}); regenerate it with the command in its folder's README.md"
        )
    return {
        "prompts": [r["prompt"] for r in rows],
        "texts": [r["response"] for r in rows],
        "gold": [r["gold"] for r in rows],
        "correct": np.array([bool(r["correct"]) for r in rows]),
    }


def picks(scores: np.ndarray) -> np.ndarray:
    """Per prompt, the index of the highest score among its N (ties: the first)."""
    return np.argmax(np.asarray(scores, dtype=np.float64).reshape(-1, N), axis=1)


def picked_correct(scores: np.ndarray, ok: np.ndarray) -> np.ndarray:
    return ok.reshape(-1, N)[np.arange(len(ok) // N), picks(scores)].astype(int)


def majority_scores(env: Any, part: dict[str, Any]) -> np.ndarray:
    """1 for the first response of each prompt's most common answer (ties: the answer seen first),
    else 0."""
    from weaver_label_diag import as_samples

    probs = as_samples(part)
    out = np.zeros(len(part["texts"]))
    for g in range(0, len(out), N):
        ans = [env.extract(p.problem, t) for p, t in zip(probs[g:g + N], part["texts"][g:g + N])]
        counts = Counter(a for a in ans if a is not None)
        if counts:
            top = max(counts.values())
            first = next(a for a in ans if a is not None and counts[a] == top)
            out[g + ans.index(first)] = 1.0
    return out


def single_rm_scores(verifier_set: str, env: Any, pool: dict[str, Any], part: dict[str, Any],
                     raw_pool: np.ndarray, raw: np.ndarray, name: str) -> tuple[str, np.ndarray]:
    """The real `SingleRMReward` (reward=single_rm or single_rm_debiased), its verifier fed its
    column of the precomputed scores: the pool in RL's two steps first (where the debiased one fixes
    its offsets), then the responses in groups of N."""
    from weaver_label_diag import GROUP, STEP_GROUPS, as_samples, members, reward_options

    from rlexp.config.reward import RewardConfig
    from rlexp.rewards.registry import build_reward

    vs = members(verifier_set)
    r = build_reward(
        RewardConfig(name="single_rm", verifiers=vs, options=reward_options(name)),
        env,
        served=False,
    )
    col = [v.name for v in vs].index(r.verifier.name)
    n = STEP_GROUPS * GROUP
    queue = [raw_pool[:n, col], raw_pool[n:, col], raw[:, col]]
    # the precomputed column, in scoring order
    r.verifier.score = lambda problems, texts: queue.pop(0)
    ps = as_samples(pool)
    for k in (0, n):
        r.score(ps[k:k + n], pool["texts"][k:k + n], group_size=GROUP)
    return r.verifier.name, np.array(r.score(as_samples(part), part["texts"], group_size=N).rewards)


def label_free_weaver(
    verifier_set: str, env: Any, part: dict[str, Any], raw: np.ndarray
) -> tuple[Any, np.ndarray]:
    from weaver_label_diag import Fed, as_samples, build, reward_options

    r = build(verifier_set, env, {**reward_options("weaver"), "window_groups": len(raw) // N})
    Fed(r, [raw])
    return r, np.array(r.score(as_samples(part), part["texts"], group_size=N).rewards)


def panel_picks(
    verifier_set: str, env: Any, pool: dict[str, Any], part: dict[str, Any]
) -> dict[str, Any]:
    """Every mode's per-prompt correctness (1/0) on one panel, with what each fit did."""
    from weaver_label_diag import (
        GROUP,
        as_samples,
        members,
        raw_scores,
        reward_options,
        score_in_rl_order,
    )

    raw_pool = raw_scores(verifier_set, env, as_samples(pool), pool["texts"], GROUP)
    raw = raw_scores(verifier_set, env, as_samples(part), part["texts"], N)
    ok = part["correct"]
    paper = reward_options("weaver_paper")
    out: dict[str, Any] = {"correct": {}, "notes": {}}
    for mode, change in FIT_AT_START.items():
        r, _, scores = score_in_rl_order(
            verifier_set, env, pool, part, raw_pool, raw, {**paper, **change}, cand_group=N
        )
        out["correct"][mode] = picked_correct(scores, ok)
        out["notes"][mode] = {"active": list(r.active), "dropped": dict(r.dropped),
                              "fallback": bool(mode == "weaver_paper" and r.params is None)}
    r, scores = label_free_weaver(verifier_set, env, part, raw)
    out["correct"]["weaver"] = picked_correct(scores, ok)
    out["notes"]["weaver"] = {
        "active": list(r.active),
        "dropped": dict(r.dropped),
        "fallback": r.params is None,
    }
    for name in ("single_rm_debiased", "single_rm"):
        vname, scores = single_rm_scores(verifier_set, env, pool, part, raw_pool, raw, name)
        out["correct"][name] = picked_correct(scores, ok)
        out["notes"][name] = {"verifier": vname}
    out["correct"]["majority"] = picked_correct(majority_scores(env, part), ok)
    names = [v.name for v in members(verifier_set)]
    each = {n: picked_correct(raw[:, i], ok) for i, n in enumerate(names)}
    best = max(each, key=lambda n: (each[n].mean(), -names.index(n)))
    out["correct"][ORACLE] = each[best]
    out["notes"][ORACLE] = {"verifier": best, "oracle": True,
                            "each": {n: float(v.mean()) for n, v in each.items()}}
    return out


# --- the registered statistics --------------------------------------------------------------------
def wilson(k: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    d = 1 + z * z / n
    c, h = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def sign_test(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Exact two-sided sign test (McNemar's exact test) on the prompts where exactly one of a, b is
    right."""
    wins, losses = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    n, k = wins + losses, min(wins, losses)
    p = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)
    return {"a_only": wins, "b_only": losses, "p": p}


def paired(a: np.ndarray, b: np.ndarray, idx: np.ndarray) -> dict[str, Any]:
    """a - b in accuracy, with the paired bootstrap's 95% percentile interval (resampled prompts
    `idx`)."""
    d = (a - b).astype(np.float64)
    boots = d[idx].mean(axis=1)
    lo, hi = float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))
    verdict = "better" if lo > 0 else "worse" if hi < 0 else "indistinguishable"
    return {"diff": float(d.mean()), "low": lo, "high": hi, "verdict": verdict, **sign_test(a, b)}


def holm(ps: list[float]) -> list[float]:
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adj, run = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        adj[i] = run
    return adj


def tests(correct: dict[str, np.ndarray]) -> dict[str, Any]:
    """weaver_paper against every other mode (Holm over these), and the mean against the vote."""
    n = len(next(iter(correct.values())))
    idx = np.random.default_rng(BOOT_SEED).integers(0, n, size=(N_BOOT, n))
    res = {f"weaver_paper - {m}": paired(correct["weaver_paper"], correct[m], idx)
           for m in MODES if m != "weaver_paper"}
    for key, p in zip(res, holm([r["p"] for r in res.values()])):
        res[key]["p_holm"] = p
    res["verifier_mean - verifier_vote"] = paired(
        correct["verifier_mean"], correct["verifier_vote"], idx
    )
    return res


def summarise(panel: dict[str, Any], ok: np.ndarray) -> dict[str, Any]:
    n = len(ok) // N
    acc = {
        m: {"accuracy": float(v.mean()), "ci": list(wilson(float(v.sum()), n))}
        for m, v in panel["correct"].items()
    }
    grouped = ok.reshape(-1, N)
    for m, v in {"pass@8": grouped.any(axis=1), "accuracy@1": grouped.mean(axis=1)}.items():
        acc[m] = {"accuracy": float(v.mean()), "ci": list(wilson(float(v.sum()), n))}
    return {"modes": acc, "tests": tests(panel["correct"]), "notes": panel["notes"],
            "per_prompt": {m: v.tolist() for m, v in panel["correct"].items()}}


# --- output ---------------------------------------------------------------------------------------
def fmt_ci(m: dict[str, Any]) -> str:
    return f"{m['accuracy']:.3f} [{m['ci'][0]:.3f}, {m['ci'][1]:.3f}]"


def markdown(res: dict[str, Any]) -> str:
    panels = list(res["panels"])
    L = [
        "# Test-time selection on every panel, with weaver_paper and paired tests (addendum v15)",
        "",
        f"Produced by `{res['command']}` (no RL; commit {res['commit']}). Responses: "
        f"the {res['n_prompts']} held-out prompts x {N} committed in `{res['samples']}` (a "
        "gold-trained policy's), the same on every panel. weaver_paper, the mean and the vote "
        "are fit as at the start of RL (the starting policy's pool, 256 dev labels); weaver "
        "(label-free) on these responses. Selection accuracy over prompts, 95% Wilson interval.",
        "",
        "| mode | " + " | ".join(f"panel {p}" for p in panels) + " |",
        "|---" * (len(panels) + 1) + "|",
    ]
    for m in ("pass@8", *MODES, "accuracy@1"):
        label = f"{m} (oracle: chosen with gold, an upper bound)" if m == ORACLE else m
        L.append(
            f"| {label} | "
            + " | ".join(fmt_ci(res["panels"][p]["modes"][m]) for p in panels)
            + " |"
        )
    L += [
        "",
        "Who the single verifiers are: "
        + "; ".join(
            f"{p}: single_rm = {r['notes']['single_rm']['verifier']}, oracle best "
            f"= {r['notes'][ORACLE]['verifier']}"
            for p, r in res["panels"].items()
        )
        + ".",
        "",
        "weaver_paper's fit: "
        + "; ".join(
            f"{p}: {len(r['notes']['weaver_paper']['active'])} active"
            + (" (FELL BACK TO THE MEAN)" if r["notes"]["weaver_paper"]["fallback"] else "")
            for p, r in res["panels"].items()
        )
        + ".",
        "",
        "## Paired tests (registered: bootstrap over prompts, 10,000 resamples, seed 0; exact "
        "sign test, Holm over weaver_paper's comparisons)",
        "",
        "| panel | comparison | difference [95% bootstrap] | only first right / only second | "
        "sign p (Holm) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for p, r in res["panels"].items():
        for k, t in r["tests"].items():
            holm_p = f" ({t['p_holm']:.3g})" if "p_holm" in t else ""
            L.append(
                f"| {p} | {k} | {t['diff']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}] "
                f"| {t['a_only']} / {t['b_only']} | {t['p']:.3g}{holm_p} | {t['verdict']} |"
            )
    counts = Counter(t["verdict"] for r in res["panels"].values() for k, t in r["tests"].items()
                     if k.startswith("weaver_paper") and not k.endswith(ORACLE))
    L += [
        "",
        f"weaver_paper against the other selectors (the oracle left out), over {len(panels)} "
        "panels: "
        + ", ".join(f"{v} {counts.get(v, 0)}" for v in ("better", "indistinguishable", "worse"))
        + ".",
        "",
    ]
    return "\n".join(L)


def figure(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(res["panels"])
    modes = ("pass@8", *MODES, "accuracy@1")
    fig, axes = plt.subplots(1, len(panels), figsize=(3 * len(panels), 4), sharey=True)
    for ax, p in zip(np.atleast_1d(axes), panels):
        ms = res["panels"][p]["modes"]
        y = np.arange(len(modes))
        acc = np.array([ms[m]["accuracy"] for m in modes])
        err = np.array([[a - ms[m]["ci"][0], ms[m]["ci"][1] - a] for m, a in zip(modes, acc)]).T
        ax.barh(y, acc, xerr=err, color=["C2" if m == "weaver_paper" else "C0" for m in modes])
        ax.set_title(f"panel {p}")
        ax.set_xlim(0, 1)
        ax.set_yticks(y, modes)
        ax.invert_yaxis()
    fig.suptitle(
        f"Selection accuracy, {N} responses per prompt (95% Wilson); {res['command']}", fontsize=8
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    import subprocess

    from weaver_label_diag import policy_pool

    from rlexp.rewards.verifiers.tiny_panels import PANEL_SETS, WIDE_SET

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, required=True, help="output prefix: PREFIX.md, PREFIX.json, PREFIX.png"
    )
    ap.add_argument("--panels", default="A,B,C,D,E,W", help="comma-separated panels (A-E, W)")
    a = ap.parse_args(argv)
    sets = {**PANEL_SETS, "W": WIDE_SET}
    chosen = [p.strip() for p in a.panels.split(",")]
    bad = [p for p in chosen if p not in sets]
    if bad:
        raise SystemExit(f"--panels: unknown {bad}; known: {sorted(sets)}")
    command = "nice -n 10 python studies/weaver/selection.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    part = load_samples()
    env, pool_samples, pool_texts = policy_pool(0)
    pool = {"prompts": [s.problem.prompt for s in pool_samples], "texts": pool_texts,
            "gold": [s.answer for s in pool_samples]}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    res: dict[str, Any] = {
        "command": command,
        "commit": commit,
        "samples": str(SAMPLES.relative_to(REPO)),
        "n_prompts": len(part["texts"]) // N,
        "panels": {},
    }
    for p in chosen:
        res["panels"][p] = summarise(panel_picks(sets[p], env, pool, part), part["correct"])
        print(
            f"panel {p}: "
            + ", ".join(f"{m} {v['accuracy']:.3f}" for m, v in res["panels"][p]["modes"].items()),
            flush=True,
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    md, text = a.out.with_suffix(".md"), markdown(res)
    # the hand-written reading is kept on regeneration
    if md.is_file() and HAND in (old := md.read_text()):
        text += "\n" + old[old.index(HAND):]
    md.write_text(text)
    figure(res, a.out.with_suffix(".png"))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
