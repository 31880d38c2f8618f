"""Weaver CPU-scale replication: aggregate a sweep into the pre-registered table, intervals and a
PNG.

    python studies/weaver/weaver_replication.py SWEEP_DIR [SWEEP_DIR ...] \\
        --out studies/weaver/results/weaver_replication

Each job folder holds metrics.jsonl (held-out `eval/accuracy` every `eval.every_n_steps`) and
.hydra/overrides.yaml (the arm and the seed). The arm of a job is its `reward` choice plus
`reward.options.verifier` when a single verifier was picked.

Pre-registered (fixed before the runs): the summary statistic is the AUC of held-out accuracy over
the whole run (trapezoid over the evaluation steps, divided by the step span: the mean accuracy over
training), reported as the mean over seeds with a 95% t-interval; the headline is the fraction of
the single-RM -> gold gap that Weaver closes, on AUC, with a 95% bootstrap interval over seeds
(seeds are paired across arms: a seed fixes the policy's initial weights and the data order). Final
accuracy (the mean of the last two evaluations) is reported beside it, never instead of it.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics as st
from itertools import pairwise
from pathlib import Path

import yaml

ORDER = ["single_rm", "best_verifier", "verifier_mean", "verifier_vote", "weaver", "annotated"]
# t quantiles (two-sided 95%) for small samples; beyond 30 the normal value is close enough.
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    m = st.mean(xs)
    if len(xs) < 2:
        return m, math.nan, math.nan
    h = _T95.get(len(xs) - 1, 1.96) * st.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def clip01(mlh: tuple[float, float, float]) -> tuple[float, float, float]:
    """Interval ends of a proportion, clipped to [0, 1] (a t-interval over few seeds can
    overshoot)."""
    return tuple(x if x != x else min(1.0, max(0.0, x)) for x in mlh)  # type: ignore[return-value]


def load_job(job: Path, best: str | None) -> dict | None:
    if not (job / "metrics.jsonl").exists():
        return None
    ov = dict(
        o.lstrip("+~").split("=", 1)
        for o in yaml.safe_load((job / ".hydra/overrides.yaml").read_text())
    )
    arm = ov.get("reward", "rule")
    if (
        arm == "single_rm"
        and ov.get("reward.options.verifier")
        and ov.get("reward.options.verifier") == best
    ):
        arm = "best_verifier"
    acc: dict[int, float] = {}
    for line in (job / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "eval/accuracy" in row:
            acc[int(row["step"])] = float(row["eval/accuracy"])
    steps = sorted(acc)
    if len(steps) < 2:
        return None
    auc = sum((acc[b] + acc[a]) / 2 * (b - a) for a, b in pairwise(steps)) / (steps[-1] - steps[0])
    # How far the final policy collapsed onto one answer (a policy that games its verifiers answers
    # alike).
    last = sorted((job / "eval_samples").glob("train_step*.jsonl"))
    answers = [json.loads(x)["response"] for x in last[-1].read_text().splitlines()] if last else []
    top = max((answers.count(a) for a in set(answers)), default=0) / max(len(answers), 1)
    return {"job": str(job), "arm": arm, "seed": int(ov.get("seed", 0)), "acc": acc, "auc": auc,
            "final": (acc[steps[-1]] + acc[steps[-2]]) / 2, "top_share": top}


def gap_fraction(
    by_arm: dict[str, dict[int, dict]], key: str, n_boot: int = 10000
) -> tuple[float, float, float]:
    """(weaver - single_rm) / (annotated - single_rm) on seed means, with a paired bootstrap over
    seeds."""
    seeds = sorted(set(by_arm["weaver"]) & set(by_arm["single_rm"]) & set(by_arm["annotated"]))

    def frac(sel: list[int]) -> float:
        w, s, g = (
            st.mean(by_arm[a][x][key] for x in sel) for a in ("weaver", "single_rm", "annotated")
        )
        return (w - s) / (g - s) if abs(g - s) > 1e-9 else math.nan

    point = frac(seeds)
    rng = random.Random(0)
    boots = sorted(
        b for b in (frac([rng.choice(seeds) for _ in seeds]) for _ in range(n_boot)) if b == b
    )
    if not boots:
        return point, math.nan, math.nan
    return point, boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]


def paired_diff(
    by_arm: dict[str, dict[int, dict]], a: str, b: str, key: str
) -> tuple[float, float, float]:
    seeds = sorted(set(by_arm.get(a, {})) & set(by_arm.get(b, {})))
    return (
        t_interval([by_arm[a][s][key] - by_arm[b][s][key] for s in seeds])
        if seeds
        else (math.nan,) * 3
    )


def plot(by_arm: dict[str, dict[int, dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for arm in [a for a in ORDER if a in by_arm]:
        runs = list(by_arm[arm].values())
        steps = sorted(set.intersection(*(set(r["acc"]) for r in runs)))
        stats = [t_interval([r["acc"][s] for r in runs]) for s in steps]
        ax.plot(steps, [m for m, _, _ in stats], label=f"{arm} (n={len(runs)})")
        if len(runs) > 1:
            ax.fill_between(
                steps, [lo for _, lo, _ in stats], [hi for _, _, hi in stats], alpha=0.15
            )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("held-out accuracy (126 problems, greedy)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("Weaver vs single verifiers vs gold (mean, 95% t-interval over seeds)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument(
        "--out", type=Path, required=True, help="output prefix: writes PREFIX.csv and PREFIX.png"
    )
    ap.add_argument(
        "--best", help="the verifier picked as the best single one (reward.options.verifier)"
    )
    args = ap.parse_args()
    runs = [r for sw in args.sweeps for job in sorted(p for p in sw.iterdir() if p.is_dir())
            if (r := load_job(job, args.best)) is not None]
    by_arm: dict[str, dict[int, dict]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    arms = [a for a in ORDER if a in by_arm] + sorted(set(by_arm) - set(ORDER))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out.with_suffix(".csv"), "w") as f:
        best = f" --best {args.best}" if args.best else ""
        f.write(
            "# produced by: python "
            f"studies/weaver/weaver_replication.py {' '.join(map(str, args.sweeps))} "
            f"--out {args.out}{best} (sweep commands: "
            "studies/weaver/results/weaver_replication.md); read with comment='#'\n"
        )
        f.write(
            "arm,seed,auc,final,top_share,"
            + ",".join(f"acc@{s}" for s in sorted(runs[0]["acc"]))
            + ",job\n"
        )
        for r in sorted(runs, key=lambda r: (arms.index(r["arm"]), r["seed"])):
            f.write(
                f"{r['arm']},{r['seed']},{r['auc']:.4f},{r['final']:.4f},{r['top_share']:.4f},"
                + ",".join(f"{r['acc'].get(s, math.nan):.4f}" for s in sorted(runs[0]["acc"]))
                + f",{r['job']}\n"
            )
    print(
        "| arm | seeds | AUC (pre-registered) | final accuracy | most common final answer's share |"
    )
    print("|---|---|---|---|---|")
    for arm in arms:
        xs = list(by_arm[arm].values())
        m, lo, hi = clip01(t_interval([x["auc"] for x in xs]))
        fm, flo, fhi = clip01(t_interval([x["final"] for x in xs]))
        tm, tlo, thi = clip01(t_interval([x["top_share"] for x in xs]))
        print(
            f"| {arm} | {len(xs)} | {m:.3f} [{lo:.3f}, {hi:.3f}] | {fm:.3f} [{flo:.3f}, {fhi:.3f}] "
            f"| {tm:.2f} [{tlo:.2f}, {thi:.2f}] |"
        )
    if all(a in by_arm for a in ("weaver", "single_rm", "annotated")):
        print()
        for key in ("auc", "final"):
            g, lo, hi = gap_fraction(by_arm, key)
            print(
                f"gap fraction closed by Weaver ({key}): {g:.2f} [95% bootstrap {lo:.2f}, {hi:.2f}]"
            )
    for other in ("verifier_mean", "verifier_vote", "best_verifier"):
        if other in by_arm and "weaver" in by_arm:
            d, lo, hi = paired_diff(by_arm, "weaver", other, "auc")
            print(f"weaver - {other} (AUC, paired by seed): {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    plot(by_arm, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
