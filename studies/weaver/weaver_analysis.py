"""The pre-registered analysis of the Weaver replication (issue 23;
studies/weaver/preregistration.md).

    python studies/weaver/weaver_analysis.py SWEEP_DIR [SWEEP_DIR ...] \\
        --out studies/weaver/results/weaver_replication [--best rm_small]
    python studies/weaver/weaver_analysis.py --selection-only --out
    studies/weaver/results/weaver_selection_static python studies/weaver/weaver_analysis.py
    --from-csv studies/weaver/results/weaver_replication.csv \\
        --out studies/weaver/results/weaver_replication
    python studies/weaver/weaver_analysis.py SWEEP_DIR --task math \\
        --out studies/weaver/results/weaver_table   # GPU: MATH/GPQA/MMLU-Pro

`--task` names the held-out set read (studies/weaver/tasks.py: the arithmetic panels' own, or
MATH-500, GPQA Diamond, MMLU-Pro on experiment=qwen3_8b_math); intervals use rlexp compare's t
quantiles (rlexp.tracking.stats).

Committed before any result of the sweep it analyses, so the statistic, the interval and the tests
cannot be chosen after seeing the numbers. It writes PREFIX.md (the table and the verdict),
PREFIX.csv (one row per run), PREFIX.png (curves) and PREFIX.json (the headline figures), all from
the run folders and, for the static selection baseline, from the verifiers themselves. `--from-csv`
recomputes from a committed PREFIX.csv instead of the run folders (so a clean clone regenerates the
tables): every figure the CSV determines is recomputed, and the ones it does not hold (best constant
answer, static best-of-K, stand-ins' hashes) are carried from the committed JSON of the same name,
which the output says.

Two gap fractions (addendum v12): the registered one, (arm - single_rm) / (annotated - single_rm),
and the gap measured from the start, (arm - start) / (annotated - start), start being the step-0
balanced accuracy. single_rm ends below the start on every panel, so the first is met by a policy
that never moves; the second scores doing nothing 0 by construction.

Why balanced accuracy: training draws sums uniformly, the held-out set is binomial (126 sequences,
sums 1-8), so plain held-out accuracy rewards the policy that always answers the commonest sum
(0.246 for "4"). Balanced accuracy, the mean over the held-out answer classes of each class's
accuracy, follows the training distribution over the classes present and gives every constant answer
exactly 1 / (number of classes).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics as st
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

_HERE = Path(__file__).resolve().parent
REPO = next(p for p in _HERE.parents if (p / "rlexp").is_dir())
# the study's modules, before and after the move
for _p in (REPO, _HERE, REPO / "studies" / "weaver"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from tasks import (  # noqa: E402
    TASKS,
    fallback_counts,
    fallback_lines,
    fell_back,
    static_selection,
    task,
)

from rlexp.tracking.stats import estimate, t975  # noqa: E402

# Arms: the reward choice (plus reward.options.verifier for the best single verifier).
ORDER = [
    "single_rm",
    "best_verifier",
    "verifier_mean",
    "verifier_vote",
    "weaver_paper",
    "weaver",
    "annotated",
]
LABEL_FREE_WEAVER = "weaver"  # today's label-free online model, kept as an arm
HEADLINE = "weaver_paper"  # the arm the goal is about
GOAL = {"gap_fraction": 0.6, "collapse_margin": 0.1}
REGISTERED = ("gap", "beats vote", "beats mean", "no collapse")  # issue 23's goal, as registered
REBASED = ("gap from start", "beats vote", "beats mean", "no collapse")  # addendum v12's
# single_rm's static best-of-K within this of a constant answer's: degenerate (v12)
DEGENERATE_MARGIN = 0.01
# a results file's hand-written part starts here and is kept on regeneration
HAND = "## What the numbers say"


# --- per run --------------------------------------------------------------------------------------
def balanced(records: list[dict]) -> float:
    """Mean over gold answer classes of the class's accuracy."""
    by: dict[str, list[bool]] = {}
    for r in records:
        by.setdefault(str(r["gold"]), []).append(bool(r["correct"]))
    return st.mean(sum(v) / len(v) for v in by.values())


def top_share(records: list[dict]) -> float:
    answers = [
        r.get("extracted") if r.get("extracted") is not None else r["response"] for r in records
    ]
    return max(Counter(answers).values()) / len(answers) if answers else math.nan


def auc(curve: dict[int, float]) -> float:
    steps = sorted(curve)
    if len(steps) < 2:
        return math.nan
    return sum((curve[b] + curve[a]) / 2 * (b - a) for a, b in pairwise(steps)) / (
        steps[-1] - steps[0]
    )


# Reward presets that are an arm under another name: the debiased single_rm (addendum v12) is the
# single_rm arm.
ARM_OF = {"single_rm_debiased": "single_rm"}


def load_run(
    job: Path, best: str | None, balance: bool = True, samples: str = "train"
) -> dict[str, Any] | None:
    """One run's figures from its eval samples (`samples`: the benchmark's file prefix,
    studies/weaver/tasks.py). Answer classes are the run's own gold answers (any environment);
    `balance=False` takes plain accuracy as the statistic instead, for free-form answers (MATH,
    GPQA, MMLU-Pro) where class balancing means nothing."""
    evals = sorted((job / "eval_samples").glob(f"{samples}_step*.jsonl"))
    if len(evals) < 2 or not (job / ".hydra/overrides.yaml").exists():
        return None
    ov = dict(
        o.lstrip("+~").split("=", 1)
        for o in yaml.safe_load((job / ".hydra/overrides.yaml").read_text())
    )
    reward = ov.get("reward", "rule")
    arm = ARM_OF.get(reward, reward)
    if arm == "single_rm" and best and ov.get("reward.options.verifier") == best:
        arm = "best_verifier"
    debiased = (
        reward in ("single_rm_debiased", "best_verifier")
        or ov.get("reward.options.debias_answers") == "true"
    )
    bal, plain, share, golds = {}, {}, {}, Counter()
    for f in evals:
        step = int(f.stem.removeprefix(f"{samples}_step"))
        recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        plain[step], share[step] = st.mean(r["correct"] for r in recs), top_share(recs)
        bal[step] = balanced(recs) if balance else plain[step]
        golds = Counter(str(r["gold"]) for r in recs)
    last = sorted(bal)[-2:]
    return {
        "job": str(job),
        "arm": arm,
        "seed": int(ov.get("seed", 0)),
        "auc": auc(bal),
        "final": st.mean(bal[s] for s in last),
        "plain_auc": auc(plain),
        "plain_final": st.mean(plain[s] for s in last),
        "top_share": share[max(share)],
        "start": bal[min(bal)],
        "curve": bal,
        "golds": golds,
        "stand_ins": stand_ins(job),
        "debiased": debiased,
        "fell_back": fell_back(job),
    }


def stand_ins(job: Path) -> dict[str, str]:
    """sha256 of the checkpoint the run starts from and of each verifier it loaded, from its
    manifest: the tiny stand-ins are trained on first use on the machine that runs the sweep, so two
    machines (or two versions of the code) can draw different ones from the same seeds; these name
    the draw."""
    path = job / "manifest.json"
    if not path.is_file():
        return {}
    try:
        m = json.loads(path.read_text())
        model, verifiers = m.get("model") or {}, m.get("verifiers") or {}
        out = {"start": str(model["sha256"])} if model.get("sha256") else {}
        return out | {str(n): str(v["sha256"]) for n, v in verifiers.items() if v.get("sha256")}
    except (ValueError, AttributeError, TypeError) as e:
        raise SystemExit(
            f"{path}: not a run manifest rlexp wrote ({e}); remove the run folder from the "
            "sweep or re-run it"
        ) from None


def shared_stand_ins(runs: list[dict[str, Any]]) -> dict[str, str]:
    """The stand-ins every run of one replication shares (a run records those it loaded). Arms
    compared paired by seed must start from one checkpoint and score with one panel: a sweep that
    mixes two draws is refused."""
    seen: dict[str, dict[str, str]] = {}
    for r in runs:
        for name, digest in r.get("stand_ins", {}).items():
            # digest -> the first run that had it
            seen.setdefault(name, {}).setdefault(digest, r["job"])
    mixed = {n: d for n, d in seen.items() if len(d) > 1}
    if mixed:
        n, d = next(iter(mixed.items()))
        raise SystemExit(
            f"the runs do not share their stand-ins: {n} differs between "
            + " and ".join(f"{job} ({h[:12]})" for h, job in d.items())
            + "; analyse the runs of one machine and one draw together (their manifests name "
              "each sha256)"
        )
    return {n: next(iter(d)) for n, d in sorted(seen.items())}


def load_sweep(
    sweep: Path, best: str | None, balance: bool = True, samples: str = "train"
) -> list[dict[str, Any]]:
    """Every finished run (with at least two evaluations) in a sweep folder, in folder-name
    order."""
    return [r for job in sorted(p for p in sweep.iterdir() if p.is_dir())
            if (r := load_run(job, best, balance, samples)) is not None]


def load_csv(path: Path) -> list[dict[str, Any]]:
    """The runs of a committed PREFIX.csv (the per-run figures `main` wrote): no curves, answers or
    hashes."""
    import csv

    lines = [x for x in path.read_text().splitlines() if x.strip() and not x.startswith("#")]
    need = {
        "arm",
        "seed",
        "auc_balanced",
        "final_balanced",
        "final_plain",
        "top_share",
        "start_balanced",
        "job",
    }
    rows = list(csv.DictReader(lines))
    if not rows or not need <= set(rows[0]):
        raise SystemExit(
            f"{path}: not a weaver_analysis CSV (needs the columns {sorted(need)}); pass the "
            ".csv a weaver_analysis run wrote"
        )
    try:
        return [
            {
                "job": r["job"],
                "arm": r["arm"],
                "seed": int(r["seed"]),
                "auc": float(r["auc_balanced"]),
                "final": float(r["final_balanced"]),
                "plain_final": float(r["final_plain"]),
                "top_share": float(r["top_share"]),
                "start": float(r["start_balanced"]),
                "debiased": r.get("debiased") == "1",
            }
            for r in rows
        ]
    except ValueError as e:
        raise SystemExit(
            f"{path}: a value is not a number ({e}); restore the file from git"
        ) from None


# --- statistics -----------------------------------------------------------------------------------
def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean with its 95% t-interval, as `rlexp compare` states it (rlexp.tracking.stats)."""
    e = estimate(xs)
    if e is None or e.half is None:
        return (st.mean(xs) if xs else math.nan), math.nan, math.nan
    return e.mean, e.mean - e.half, e.mean + e.half


def paired_test(a: list[float], b: list[float]) -> dict[str, float]:
    """Paired over seeds: mean difference, its 95% t-interval, the two-sided paired t-test's
    p-value."""
    from scipy.stats import ttest_rel

    d = [x - y for x, y in zip(a, b)]
    m, lo, hi = t_interval(d)
    p = float(ttest_rel(a, b).pvalue) if len(d) > 1 and st.stdev(d) > 0 else math.nan
    return {"diff": m, "low": lo, "high": hi, "p": p, "n": len(d)}


def fieller(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Ratio mean(num) / mean(den) of paired per-seed values with Fieller's 95% interval (df n-1);
    the ends are +-inf when the denominator is not distinguishable from zero (the ratio is then
    unbounded)."""
    n = len(num)
    a, b = st.mean(num), st.mean(den)
    point = a / b if b else math.nan
    if n < 2:
        return point, math.nan, math.nan
    vaa, vbb = st.variance(num) / n, st.variance(den) / n
    vab = sum((x - a) * (y - b) for x, y in zip(num, den)) / (n - 1) / n
    t2 = t975(n - 1) ** 2
    qa, qb, qc = b * b - t2 * vbb, -2 * (a * b - t2 * vab), a * a - t2 * vaa
    disc = qb * qb - 4 * qa * qc
    # exactly proportional seeds: 0, not rounding's sign
    disc = 0.0 if abs(disc) <= 1e-12 * qb * qb else disc
    if qa <= 0 or disc < 0:
        return point, -math.inf, math.inf
    r = math.sqrt(disc)
    return point, (-qb - r) / (2 * qa), (-qb + r) / (2 * qa)


# --- the report -----------------------------------------------------------------------------------
def analyse(
    runs: list[dict[str, Any]], selection: dict[str, dict[str, float]] | None
) -> dict[str, Any]:
    by: dict[str, dict[int, dict]] = {}
    for r in runs:
        if r["seed"] in by.get(r["arm"], {}):
            raise SystemExit(
                f"two runs of arm {r['arm']} seed {r['seed']}: {by[r['arm']][r['seed']]['job']} "
                f"and {r['job']}; pass the sweep folders of one replication only"
            )
        by.setdefault(r["arm"], {})[r["seed"]] = r
    arms = [a for a in ORDER if a in by] + sorted(set(by) - set(ORDER))
    golds = runs[0].get("golds")  # absent when read from a CSV: then carried (main)
    res: dict[str, Any] = {
        "statistic": "AUC of balanced held-out accuracy (pre-registered)",
        "arms": {},
        "stand_ins": shared_stand_ins(runs),
    }
    for a in arms:
        xs = list(by[a].values())
        # Every statistic is a proportion: interval ends clipped to [0, 1] (a t-interval over few
        # seeds overshoots).
        res["arms"][a] = {
            k: dict(
                zip(
                    ("mean", "low", "high"),
                    (
                        min(1.0, max(0.0, v)) if v == v else v
                        for v in t_interval([x[k] for x in xs])
                    ),
                )
            )
            for k in ("auc", "final", "plain_final", "top_share")
        }
        res["arms"][a]["n_seeds"] = len(xs)
        res["arms"][a]["per_seed"] = {str(s): by[a][s]["auc"] for s in sorted(by[a])}
    res["baselines"] = {
        "best_constant_answer": {
            "balanced": 1 / len(golds),
            "plain": max(golds.values()) / sum(golds.values()),
            "answer": golds.most_common(1)[0][0],
        }
        if golds
        else {},
        "no_learning_policy": dict(
            zip(("mean", "low", "high"), t_interval([r["start"] for r in runs]))
        ),
        "static_best_of_k": selection or {},
    }
    if all(k in by for k in (HEADLINE, "single_rm", "annotated")):
        auc_of = {
            a: {s: r["auc"] for s, r in by[a].items()} for a in (HEADLINE, "single_rm", "annotated")
        }
        res["gap_fraction"] = gap_fraction(
            auc_of[HEADLINE], auc_of["single_rm"], auc_of["annotated"]
        )
    if "annotated" in by:
        start = {s: r["start"] for s, r in by["annotated"].items()}
        gold = {s: r["auc"] for s, r in by["annotated"].items()}
        res["start_gap_fraction"] = {
            a: gap_fraction({s: r["auc"] for s, r in by[a].items()}, start, gold)
            # annotated: 1 by construction, listed (issue 46)
            for a in arms
        }
    res["paired"] = {}
    for other in ("verifier_vote", "verifier_mean", LABEL_FREE_WEAVER, "single_rm"):
        if HEADLINE in by and other in by and other != HEADLINE:
            seeds = sorted(set(by[HEADLINE]) & set(by[other]))
            res["paired"][other] = paired_test([by[HEADLINE][s]["auc"] for s in seeds],
                                               [by[other][s]["auc"] for s in seeds])
    if HEADLINE in by and "annotated" in by:
        res["collapse"] = {"headline_top_share": res["arms"][HEADLINE]["top_share"]["mean"],
                           "gold_top_share": res["arms"]["annotated"]["top_share"]["mean"]}
    conditions = goal_conditions(res)
    res["goal_met"] = all(conditions[k] for k in REGISTERED)
    res["goal_met_rebased"] = all(conditions[k] for k in REBASED)
    single = [r for r in runs if r["arm"] == "single_rm"]
    res["single_rm_debiased"] = bool(single) and all(r.get("debiased") for r in single)
    res["fallback_runs"] = fallback_counts(runs)  # addendum v15: [fell back, logged] per Weaver arm
    return res


def degenerate_single_rm(res: dict[str, Any]) -> bool | None:
    """Addendum v12: single_rm's reward model is degenerate when its static best-of-K balanced
    selection is within DEGENERATE_MARGIN of the best constant answer's (it ranks one answer first
    whatever the question); None when either figure is missing."""
    b = res["baselines"]
    sel, const = (b.get("static_best_of_k") or {}).get("single_rm"), b.get("best_constant_answer")
    if not sel or not const:
        return None
    return abs(sel["balanced"] - const["balanced"]) <= DEGENERATE_MARGIN


def gap_fraction(
    arm: dict[Any, float], single: dict[Any, float], gold: dict[Any, float]
) -> dict[str, Any]:
    """(arm - base) / (annotated - base) on the seeds all three have, each a per-seed value: the
    ratio of paired means with Fieller's 95% interval, and the per-seed ratios beside it. The base
    is single_rm's AUC (the registered gap) or the run's step-0 balanced accuracy (addendum v12's
    gap from the start)."""
    seeds = sorted(set(arm) & set(single) & set(gold), key=int)
    num = [arm[s] - single[s] for s in seeds]
    den = [gold[s] - single[s] for s in seeds]
    g, lo, hi = fieller(num, den)
    return {"point": g, "low": lo, "high": hi, "n_seeds": len(seeds), "interval": "Fieller 95%",
            "per_seed": {str(s): (n / d if d else math.nan) for s, n, d in zip(seeds, num, den)}}


def goal_conditions(res: dict[str, Any]) -> dict[str, bool]:
    """Issue 23's goal, condition by condition, from an analysis result (`analyse`, or its JSON); a
    condition whose figure is missing is not met."""
    gf, col = res.get("gap_fraction"), res.get("collapse")
    sg = (res.get("start_gap_fraction") or {}).get(HEADLINE)
    pv, pm = res["paired"].get("verifier_vote"), res["paired"].get("verifier_mean")
    return {"gap": bool(gf) and gf["point"] >= GOAL["gap_fraction"],
            "gap from start": bool(sg) and sg["point"] >= GOAL["gap_fraction"] and sg["low"] > 0,
            "beats vote": bool(pv) and pv["low"] > 0,
            "beats mean": bool(pm) and pm["low"] > 0,
            "no collapse": bool(col) and abs(col["headline_top_share"] - col["gold_top_share"])
            <= GOAL["collapse_margin"]}


def fmt(d: dict[str, float], p: int = 3) -> str:
    return f"{d['mean']:.{p}f} [{d['low']:.{p}f}, {d['high']:.{p}f}]"


def markdown(res: dict[str, Any], command: str) -> str:
    lines = [
        f"Produced by `{command}`; statistic: {res['statistic']}, mean over seeds with a 95% "
        "t-interval.",
        "",
        "| arm | seeds | AUC balanced (pre-registered) | final balanced | final plain "
        "| most common answer's share |",
        "|---|---|---|---|---|---|",
    ]
    for a, v in res["arms"].items():
        lines.append(
            f"| {a} | {v['n_seeds']} | {fmt(v['auc'])} | {fmt(v['final'])} "
            f"| {fmt(v['plain_final'])} | {fmt(v['top_share'], 2)} |"
        )
    b = res["baselines"]
    if res.get("stand_ins"):
        lines += [
            "",
            "Stand-ins shared by every run (sha256, first 12 hex digits; the run manifests hold "
            "them whole): "
            + ", ".join(f"{n} {h[:12]}" for n, h in res["stand_ins"].items())
            + ".",
        ]
    const = b["best_constant_answer"]
    const_text = (
        f"best constant answer ({const['answer']!r}) balanced {const['balanced']:.3f}, plain "
        f"{const['plain']:.3f}; "
        if const
        else ""
    )
    lines += [
        "",
        f"Baselines: {const_text}no-learning policy (step 0) "
        f"balanced {fmt(b['no_learning_policy'])}.",
    ]
    if res.get("carried"):
        lines += ["", res["carried"]]
    if b["static_best_of_k"]:
        lines += [
            "",
            "Static best-of-10 selection over the same verifiers (balanced / plain): "
            + "; ".join(
                f"{a} {v['balanced']:.3f} / {v['plain']:.3f}"
                for a, v in b["static_best_of_k"].items()
            ),
        ]
    if "gap_fraction" in res:
        g = res["gap_fraction"]
        lines += [
            "",
            f"Gap fraction closed by {HEADLINE} (AUC): {g['point']:.3f} "
            f"[{g['interval']} {g['low']:.3f}, {g['high']:.3f}], n={g['n_seeds']}; per seed: "
            + ", ".join(f"{s}: {v:.3f}" for s, v in g["per_seed"].items()),
        ]
    lines += start_gap_lines(res) + fallback_lines(res.get("fallback_runs") or {})
    for other, p in res["paired"].items():
        lines.append(f"- {HEADLINE} - {other} (AUC, paired by seed, n={p['n']}): {p['diff']:+.3f} "
                     f"[{p['low']:+.3f}, {p['high']:+.3f}], paired t-test p={p['p']:.3g}")
    lines += [
        "",
        f"Goal (gap >= {GOAL['gap_fraction']}, intervals vs vote and mean above zero, "
        f"most-common-answer share within {GOAL['collapse_margin']} of "
        f"gold's): {'met' if res['goal_met'] else 'NOT met'}.",
    ]
    if "goal_met_rebased" in res:
        lines.append(
            f"Goal re-based (addendum v12: the gap from the start >= {GOAL['gap_fraction']} "
            "with its lower end above 0, the other three "
            f"unchanged): {'met' if res['goal_met_rebased'] else 'NOT met'}."
        )
    return "\n".join(lines) + "\n"


def _ends(g: dict[str, Any]) -> str:
    return ", ".join("unbounded" if math.isinf(x) else f"{x:.3f}" for x in (g["low"], g["high"]))


def start_gap_lines(res: dict[str, Any]) -> list[str]:
    """Addendum v12's gap from the start, every arm, and single_rm's degenerate-choice flag."""
    out: list[str] = []
    sg = res.get("start_gap_fraction") or {}
    if sg:
        out += [
            "",
            "Gap measured from the start (addendum v12): (arm - step-0 balanced) / (annotated - "
            "step-0 balanced), AUC, ratio of paired means with Fieller's 95% interval; doing "
            "nothing scores 0:",
            "",
            "| arm | share of the start -> gold gain | n | per seed |",
            "|---|---|---|---|",
        ]
        for a, g in sg.items():
            per = ", ".join(f"{s}: {v:.2f}" for s, v in g["per_seed"].items())
            out.append(f"| {a} | {g['point']:.3f} [{_ends(g)}] | {g['n_seeds']} | {per} |")
    degenerate = degenerate_single_rm(res)
    if degenerate is not None:
        out += [
            "",
            "single_rm's reward model is DEGENERATE (addendum v12): its static best-of-K "
            "balanced selection equals a constant answer's, so the single-RM-based gap fraction "
            "is measured against a baseline that ranks one answer first whatever the question."
            if degenerate
            else "single_rm's reward model is not degenerate (its static best-of-K balanced "
                 "selection is above a constant answer's by more than 0.01).",
        ]
    if "single_rm" in res["arms"]:
        out += [
            "",
            "single_rm here had no per-answer debiasing (every other verifier arm had it); a "
            "committed sweep cannot change, later sweeps give single_rm the same debiasing "
            "(addendum v12)."
            if not res.get("single_rm_debiased")
            else "single_rm had the same per-answer debiasing.",
        ]
    return out + ([""] if out else [])


def plot(runs: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["arm"], []).append(r)
    for arm in [a for a in ORDER if a in by] + sorted(set(by) - set(ORDER)):
        steps = sorted(set.intersection(*(set(r["curve"]) for r in by[arm])))
        stats = [t_interval([r["curve"][s] for r in by[arm]]) for s in steps]
        ax.plot(steps, [m for m, _, _ in stats], label=f"{arm} (n={len(by[arm])})")
        if len(by[arm]) > 1:
            ax.fill_between(
                steps, [lo for _, lo, _ in stats], [hi for _, _, hi in stats], alpha=0.15
            )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("balanced held-out accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="*", type=Path)
    ap.add_argument(
        "--out", type=Path, required=True, help="output prefix: PREFIX.md/.csv/.png/.json"
    )
    ap.add_argument("--best", help="the verifier chosen on labelled data as the best single one")
    ap.add_argument(
        "--no-selection", action="store_true", help="skip the static best-of-K baseline"
    )
    ap.add_argument(
        "--verifier-set",
        default="arithmetic",
        help="the panel the sweep used (its static baseline)",
    )
    ap.add_argument(
        "--selection-only", action="store_true", help="only the static best-of-K baseline"
    )
    ap.add_argument(
        "--from-csv", type=Path, help="recompute from a committed PREFIX.csv instead of run folders"
    )
    ap.add_argument("--no-balance", action="store_true",
                    help="plain accuracy as the statistic (implied by every --task but arithmetic)")
    ap.add_argument("--task", default="arithmetic", choices=sorted(TASKS),
                    help="the held-out set the statistic reads (studies/weaver/tasks.py)")
    args = ap.parse_args(argv)
    t = task(args.task)
    args.no_balance = args.no_balance or not t.balanced
    args.no_selection = args.no_selection or not t.static_selection
    if not (args.no_selection or args.from_csv) and not args.verifier_set.startswith("arithmetic"):
        raise SystemExit(
            "the static best-of-K baseline answers every prompt with the digits 0-9 (the "
            f"arithmetic task); verifier set {args.verifier_set!r} is not one: pass "
            "--no-selection"
        )
    command = "python studies/weaver/weaver_analysis.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    if args.from_csv:
        return from_csv(args.from_csv, args.out, command)
    selection = (
        None if args.no_selection
        else static_selection(args.best, args.verifier_set, balanced, t.env_options)
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.selection_only:
        args.out.with_suffix(".json").write_text(
            json.dumps({"command": command, "static_best_of_k": selection}, indent=2) + "\n"
        )
        print(json.dumps(selection, indent=2))
        return 0
    runs = [
        r for sw in args.sweeps for r in load_sweep(sw, args.best, not args.no_balance, t.samples)
    ]
    if not runs:
        raise SystemExit(f"no finished runs with evaluations under {[str(s) for s in args.sweeps]}")
    res = analyse(runs, selection)
    if args.no_balance:
        res["statistic"] = (
            f"AUC of plain held-out accuracy on {TASKS[args.task].label.split(' (')[0]}"
        )
    res["degenerate_single_rm"] = degenerate_single_rm(res)
    res["command"] = command
    with open(args.out.with_suffix(".csv"), "w") as f:
        f.write(f"# produced by: {command}; read with comment='#'\n")
        f.write(
            "arm,seed,auc_balanced,final_balanced,final_plain,top_share,start_balanced,job,debias"
            "ed\n"
        )
        for r in sorted(runs, key=lambda r: (r["arm"], r["seed"])):
            f.write(
                f"{r['arm']},{r['seed']},{r['auc']:.4f},{r['final']:.4f},{r['plain_final']:.4f},"
                f"{r['top_share']:.4f},{r['start']:.4f},{r['job']},{int(r['debiased'])}\n"
            )
    write_report(res, args.out, command)
    plot(runs, args.out.with_suffix(".png"))
    return 0


def write_report(res: dict[str, Any], out: Path, command: str) -> None:
    """PREFIX.json and PREFIX.md; a hand-written part of an existing PREFIX.md (from HAND on) is
    kept."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    text = markdown(res, command)
    md = out.with_suffix(".md")
    if md.is_file() and HAND in (old := md.read_text()):
        text += "\n" + old[old.index(HAND):]
    md.write_text(text)
    print(text)


def from_csv(csv: Path, out: Path, command: str) -> int:
    """Recompute PREFIX.json/.md from a committed CSV; the CSV and the PNG (curves, not in the CSV)
    are left as they are. What the CSV does not hold is carried from the committed JSON beside
    it."""
    if not csv.is_file():
        raise SystemExit(
            f"{csv}: no such file; pass a PREFIX.csv that weaver_analysis wrote (results/)"
        )
    runs = load_csv(csv)
    old_path = csv.with_suffix(".json")
    old: dict[str, Any] = {}
    if old_path.is_file():
        try:
            old = json.loads(old_path.read_text())
        except ValueError as e:
            raise SystemExit(f"{old_path}: not JSON ({e}); restore it from git") from None
    old_b = old.get("baselines") or {}
    res = analyse(runs, old_b.get("static_best_of_k") or None)
    res["baselines"]["best_constant_answer"] = old_b.get("best_constant_answer") or {}
    res["stand_ins"] = old.get("stand_ins") or {}
    res["degenerate_single_rm"] = degenerate_single_rm(res)
    first = csv.read_text().splitlines()[0]
    res["csv_command"] = (
        first.removeprefix("# produced by: ").split(";")[0] if first.startswith("#") else None
    )
    res["carried"] = (
        f"Recomputed from {csv} (whose runs were analysed by `{res['csv_command']}`); the best "
        f"constant answer, the static best-of-K selection and the stand-ins' hashes carried from "
        f"{old_path} as committed."
        if old
        else f"Recomputed from {csv}; no JSON beside it to carry "
        "the best constant answer, the static selection or the stand-ins from."
    )
    res["command"] = command
    write_report(res, out, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
