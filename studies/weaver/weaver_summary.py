"""Issue 23 across the verifier panels: where weaver_paper stands against the goal, and how much room each panel
left it (studies/weaver/preregistration.md, addendum v11, which fixed these figures before A's
re-run).

    python studies/weaver/weaver_summary.py --out studies/weaver/results/weaver_summary

Reads only committed files: each panel's replication JSON (`studies/weaver/weaver_analysis.py`) and
its label-model diagnosis (`studies/weaver/weaver_label_diag.py`, the starting policy's pool, no
RL). Nothing here is a new test; the figures are the per-panel analyses' own, plus one the addendum
added:

* the gap fraction of the two baselines, with the same Fieller interval as weaver_paper's: a
baseline that closes
  the whole single-RM -> gold gap by itself leaves weaver_paper nothing to win on that scale;
* the label model's weights on the pool (its estimated TPR - FPR of each active verifier, as
`weighting: quality`
  uses them), scaled to sum to 1: near-uniform weights make weaver_paper's reward close to the
  unweighted mean's.

* (addendum v12) the gap measured from the start, (arm - step-0) / (gold - step-0), each panel's
analysis's own
  `start_gap_fraction` for weaver_paper, the mean and vote, whether single_rm's reward model was
  degenerate there, and the re-based goal (the gap from the start >= 0.6 with its lower end above 0,
  the other three unchanged).

Across panels the file counts how many meet each condition of the goal; the panels are not a sample
of anything, so there is no pooled estimate.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weaver_analysis import HEADLINE, REBASED, gap_fraction, goal_conditions

BASELINES = ("verifier_mean", "verifier_vote")
# the hand-written part starts here and is kept
HAND = "## What the numbers say (written after the run"


@dataclass(frozen=True)
class Panel:
    name: str
    replication: str  # the latest sweep's JSON under the final recipe
    label_model: str  # the pool diagnosis's JSON
    key: str  # the panel's key in it
    sweep: str  # which addendum registered the sweep


R = "studies/weaver/results/"  # relative to --root
PANELS = (
    Panel("A", R + "weaver_replication.json", R + "weaver_label_model.json", "A", "v11"),
    Panel("B", R + "weaver_replication_b_v4.json", R + "weaver_label_model.json", "B", "v5"),
    Panel("D", R + "weaver_replication_d10.json", R + "weaver_label_model_d.json", "D", "v6 + v7"),
    Panel("E", R + "weaver_replication_e.json", R + "weaver_label_model_e.json", "E", "v9"),
    Panel(
        "E + KL anchor",
        R + "weaver_replication_e_kl.json",
        R + "weaver_label_model_e.json",
        "E",
        "v10",
    ),
)


@functools.cache  # panels share label-model files
def _load(root: Path, rel: str) -> dict[str, Any]:
    path = root / rel
    if not path.is_file():
        raise SystemExit(
            f"{rel} is missing: it is written by the command its panel's addendum names "
            "(studies/weaver/preregistration.md); run that first"
        )
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise SystemExit(
            f"{rel} is not JSON ({e}): restore it from git or run its panel's command again"
        ) from None


def gap(arms: dict[str, Any], arm: str) -> dict[str, Any]:
    """The gap fraction of any arm, computed as weaver_analysis computes the headline's."""
    return gap_fraction(*(arms[a]["per_seed"] for a in (arm, "single_rm", "annotated")))


def weights(diag: dict[str, Any]) -> dict[str, float]:
    """The label model's TPR - FPR per active verifier on the pool (clipped at 0, as `weighting:
    quality`), summing to 1; empty when it estimated none."""
    raw = {n: max(0.0, v["est_tpr"] - v["est_fpr"]) for n, v in diag["verifiers"].items()
           if v["active"] and not (math.isnan(v["est_tpr"]) or math.isnan(v["est_fpr"]))}
    total = sum(raw.values())
    return {n: w / total for n, w in raw.items()} if total > 0 else {}


def summarise(panel: Panel, root: Path) -> dict[str, Any]:
    rep = _load(root, panel.replication)
    diag = _load(root, panel.label_model)["panels"][panel.key]
    arms = rep["arms"]
    w = weights(diag["pool_diagnosis"])
    pool = {b: diag["paired"][f"pool: {HEADLINE}[quality] - {b}"]["group_auc"] for b in BASELINES}
    conditions = goal_conditions(rep)
    return {
        "panel": panel.name,
        "sweep": panel.sweep,
        "source": panel.replication,
        "command": rep["command"],
        "auc": {a: arms[a]["auc"] for a in ("single_rm", *BASELINES, HEADLINE, "annotated")},
        "n_seeds": arms[HEADLINE]["n_seeds"],
        "gap": {a: gap(arms, a) for a in (HEADLINE, *BASELINES)},
        "paired": {b: rep["paired"][b] for b in BASELINES},
        "pool_group_auc": pool,
        "active": diag["pool_diagnosis"]["active"],
        "weights": w,
        # None when the label model gave an active verifier no weight (or weighted none).
        "weight_spread": (max(w.values()) / min(w.values())) if w and min(w.values()) > 0 else None,
        "conditions": conditions,
        "goal_met": rep["goal_met"],
        # Addendum v12: the gap from the start, as the panel's analysis computed it (absent in an
        # older file).
        "start": ((rep.get("baselines") or {}).get("no_learning_policy") or {}).get("mean"),
        "start_gap": {
            a: g
            for a, g in (rep.get("start_gap_fraction") or {}).items()
            if a in (HEADLINE, *BASELINES)
        },
        "degenerate_single_rm": rep.get("degenerate_single_rm"),
        "goal_met_rebased": all(conditions[k] for k in REBASED),
    }


def _ci(d: dict[str, float], key: str = "point", signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    lo, hi = d["low"], d["high"]
    ends = ", ".join("unbounded" if math.isinf(x) else f.format(x) for x in (lo, hi))
    return f"{f.format(d[key])} [{ends}]"


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    L = [
        "# Weaver (issue 23) across the verifier panels: the goal's conditions, and the room "
        "each panel left",
        "",
        f"Produced by `{command}` from the committed files each row names (each states its own "
        "command). Statistic: AUC of balanced held-out accuracy (pre-registered); intervals "
        "95% (t over seeds; Fieller for gap fractions; bootstrap over pool groups for the pool "
        "figures). Panel C has no sweep under the final recipe: its filters keep two "
        "verifiers, below the label model's minimum of three, so weaver_paper is the filtered "
        "mean there.",
        "",
        "## The goal, per panel",
        "",
        "| panel (addendum) | seeds | gap closed by weaver_paper | weaver_paper - vote | "
        "weaver_paper - mean | gap >= 0.6 | beats vote | beats mean | no collapse |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    yes = {True: "yes", False: "no"}
    for r in rows:
        c = r["conditions"]
        vote, mean = (_ci(r["paired"][b], "diff", True) for b in BASELINES[::-1])
        L.append(
            f"| {r['panel']} ({r['sweep']}) | {r['n_seeds']} | {_ci(r['gap'][HEADLINE])} | "
            f"{vote} | {mean} | {yes[c['gap']]} | {yes[c['beats vote']]} | "
            f"{yes[c['beats mean']]} | {yes[c['no collapse']]} |"
        )
    n = len(rows)
    counts = {k: sum(r["conditions"][k] for r in rows) for k in rows[0]["conditions"]}
    L += [
        "",
        "Panels meeting each condition (of "
        + str(n)
        + "): "
        + "; ".join(f"{k} {v}" for k, v in counts.items())
        + f"; all four (the goal) {sum(r['goal_met'] for r in rows)}.",
        "",
        "## The room each panel left: what the baselines close by themselves",
        "",
        "| panel | AUC single_rm | AUC gold | gap closed by the mean | by vote | by weaver_paper |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        a = r["auc"]
        L.append(
            f"| {r['panel']} | {a['single_rm']['mean']:.3f} | {a['annotated']['mean']:.3f} "
            f"| {_ci(r['gap']['verifier_mean'])} | {_ci(r['gap']['verifier_vote'])} "
            f"| {_ci(r['gap'][HEADLINE])} |"
        )
    L += start_gap_section(rows)
    L += [
        "",
        "## Before any RL: the label model on the starting policy's pool",
        "",
        "Within-group AUC (the ranking GRPO's advantage uses) of weaver_paper's reward minus "
        "each baseline's, and the label model's weights on the active verifiers (estimated TPR "
        "- FPR, scaled to sum to 1; the mean gives each 1/k).",
        "",
        "| panel | weaver_paper - mean | weaver_paper - vote | active verifiers: weight | "
        "largest / smallest |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r["panel"].endswith("anchor"):
            continue  # the same pool as E
        w = ", ".join(f"{k} {v:.2f}" for k, v in r["weights"].items()) or "none"
        spread = "a weight is 0" if r["weight_spread"] is None else f"{r['weight_spread']:.2f}"
        p = r["pool_group_auc"]
        L.append(
            f"| {r['panel']} | {_ci(p['verifier_mean'], 'diff', True)} "
            f"| {_ci(p['verifier_vote'], 'diff', True)} | {w} | {spread} |"
        )
    L += ["", "Sources: " + "; ".join(f"{r['panel']}: {r['source']}" for r in rows) + "."]
    return "\n".join(L) + "\n"


def start_gap_section(rows: list[dict[str, Any]]) -> list[str]:
    """Addendum v12's table: the share of the start -> gold gain, and the re-based goal, per
    panel."""
    yes = {True: "yes", False: "no", None: "not measured"}
    L = [
        "",
        "## The gap measured from the start (addendum v12)",
        "",
        "Share of the start -> gold gain, (arm - step-0 balanced) / (annotated - step-0 "
        "balanced) on the per-seed AUCs, Fieller 95%. A policy that never moves scores 0 (on "
        "the registered scale above it closes most of the gap, because single_rm ends below the "
        "start).",
        "",
        "| panel | start (step 0) | AUC gold | weaver_paper | the mean | vote | single_rm "
        "degenerate | gap from start >= 0.6, low > 0 | re-based goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        g = r["start_gap"]
        cells = " | ".join(_ci(g[a]) if a in g else "-" for a in (HEADLINE, *BASELINES))
        start = "-" if r["start"] is None else f"{r['start']:.3f}"
        L.append(f"| {r['panel']} | {start} | {r['auc']['annotated']['mean']:.3f} | {cells} | "
                 f"{yes[r['degenerate_single_rm']]} | {yes[r['conditions']['gap from start']]} | "
                 f"{yes[r['goal_met_rebased']]} |")
    L += [
        "",
        "Panels meeting the re-based gap condition (of "
        f"{len(rows)}): {sum(r['conditions']['gap from start'] for r in rows)}; the re-based "
        f"goal: {sum(r['goal_met_rebased'] for r in rows)}. Every committed sweep's single_rm "
        "had no per-answer debiasing while every other verifier arm had it (the sweeps cannot "
        "change; addendum v12).",
    ]
    return L


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, required=True, help="output prefix: PREFIX.md and PREFIX.json"
    )
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                    help="the repository whose results/ are read (default: this one)")
    a = ap.parse_args(argv)
    rows = [summarise(p, a.root) for p in PANELS]
    command = "python studies/weaver/weaver_summary.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    text = markdown(rows, command)
    md = a.out.with_suffix(".md")
    if md.is_file() and HAND in (old := md.read_text()):
        text += "\n" + old[old.index(HAND):]
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(text)
    a.out.with_suffix(".json").write_text(
        json.dumps({"command": command, "panels": rows}, indent=1) + "\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
