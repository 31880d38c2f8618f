"""Does a KL anchor to the starting policy stop the verifier-based arms from optimising past their verifiers?
(issue 23; studies/weaver/preregistration.md, addendum v10). Committed before the anchored sweep's
runs.

    python studies/weaver/weaver_anchor.py ANCHORED_SWEEP/E --base BASE_SWEEP/E --best e_rm_a \\
        --out studies/weaver/results/weaver_anchor_e

The anchored sweep's own table (the pre-registered statistic, gap and paired tests) comes from
`studies/weaver/weaver_analysis.py`; this script adds the secondary figures of the addendum, per arm
and paired by seed against the same arm without the anchor:

* the change in AUC of balanced held-out accuracy (anchored minus base), mean with a 95% t-interval;
* the give-back: the best balanced accuracy at any evaluation after step 0 minus the final one (mean
of the last
  two evaluations, `weaver_analysis.load_run`'s "final"). A policy that peaks and then learns the
  answers its verifiers wrongly accept gives back; one that holds gives back 0.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weaver_analysis import ORDER, load_sweep, paired_test, t_interval


def give_back(run: dict[str, Any]) -> float:
    """Best balanced accuracy after the start minus the final. Never below zero: the final is the
    mean of the last two evaluations, which are among the later ones."""
    curve: dict[int, float] = run["curve"]
    return max(v for s, v in curve.items() if s > min(curve)) - run["final"]


def runs_by_arm(sweep: Path, best: str | None) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for r in load_sweep(sweep, best):
        out.setdefault(r["arm"], {})[r["seed"]] = r
    return out


def compare(anchored: dict[str, dict[int, dict[str, Any]]],
            base: dict[str, dict[int, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for arm in [a for a in ORDER if a in anchored and a in base]:
        seeds = sorted(set(anchored[arm]) & set(base[arm]))
        if not seeds:
            continue
        a = [anchored[arm][s] for s in seeds]
        b = [base[arm][s] for s in seeds]
        rows[arm] = {
            "seeds": seeds,
            "auc_anchored": t_interval([r["auc"] for r in a]),
            "auc_base": t_interval([r["auc"] for r in b]),
            "auc_change": paired_test([r["auc"] for r in a], [r["auc"] for r in b]),
            "give_back_anchored": t_interval([give_back(r) for r in a]),
            "give_back_base": t_interval([give_back(r) for r in b]),
            "give_back_change": paired_test([give_back(r) for r in a], [give_back(r) for r in b]),
        }
    return rows


def _ci(t: tuple[float, float, float]) -> str:
    m, lo, hi = t
    return f"{m:.3f}" if math.isnan(lo) else f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def _diff(d: dict[str, float]) -> str:
    if math.isnan(d["low"]):
        return f"{d['diff']:+.3f}"
    return f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def render(rows: dict[str, dict[str, Any]], command: str) -> str:
    lines = [
        "# KL anchor to the starting policy, panel E: each arm against itself without the anchor",
        "",
        f"Produced by `{command}`. Secondary figures of studies/weaver/preregistration.md "
        "addendum v10, paired by seed (95% t-intervals); the anchored sweep's pre-registered "
        "table is its own file.",
        "",
        "| arm | seeds | AUC balanced, anchored | without | change | give-back, anchored | "
        "without | change |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in rows.items():
        lines.append(
            f"| {arm} | {len(r['seeds'])} | {_ci(r['auc_anchored'])} | {_ci(r['auc_base'])} "
            f"| {_diff(r['auc_change'])} | {_ci(r['give_back_anchored'])} "
            f"| {_ci(r['give_back_base'])} | {_diff(r['give_back_change'])} |"
        )
    lines += [
        "",
        "Give-back: the best balanced held-out accuracy at any evaluation after step 0 minus "
        "the final one (mean of the last two evaluations).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("anchored", type=Path)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument(
        "--best", default=None, help="the best_verifier arm's verifier, as in weaver_analysis.py"
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    for sweep in (a.anchored, a.base):
        if not sweep.is_dir():
            ap.error(
                f"{sweep} is not a sweep folder (one run folder per arm and seed, e.g. "
                "/tmp/h23/sweep10/E)"
            )
    rows = compare(runs_by_arm(a.anchored, a.best), runs_by_arm(a.base, a.best))
    if not rows:
        print(f"no arm has runs in both {a.anchored} and {a.base}", file=sys.stderr)
        return 1
    command = "python studies/weaver/weaver_anchor.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text(render(rows, command))
    a.out.with_suffix(".json").write_text(
        json.dumps({"command": command, "arms": rows}, indent=1) + "\n"
    )
    print(a.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
