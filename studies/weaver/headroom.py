"""A task with headroom (issue 46 item 3): per-class held-out counts of the arithmetic evaluation,
and per-class greedy accuracy of run folders (the gold pilot), without any RL of its own.

    python studies/weaver/headroom.py --out studies/weaver/results/headroom_counts
    python studies/weaver/headroom.py --runs /tmp/h46/pilot/annotated-100 ... \\
        --out studies/weaver/results/headroom_pilot
    python studies/weaver/headroom.py --runs SWEEP/H \\
        --ceiling studies/weaver/results/weaver_replication_h.json \\
        --out studies/weaver/results/headroom_classes

`--runs` takes run folders or folders of run folders (named ARM-SEED); per arm it reports each
class's final accuracy (mean of the last two evaluations) averaged over seeds, and whether the gold
arm (`annotated`) learns every class: >= LEARNED of the class right (addendum v18). `--ceiling`
reads a weaver_analysis JSON's per-seed AUCs and tests every arm against gold, paired by seed
(weaver_analysis.paired_test): gold is a ceiling when no arm's 95% interval lies above 0.

Why: the balanced metric is the mean of per-class accuracies, so a class with 2 held-out prompts
moves it by 1/16 per prompt. `environment.options.held_out_min` (rlexp/envs/arithmetic.py) drops
such classes from the evaluation (and, with train_sums=held_out, from training) without moving any
other prompt, so the verifier split, and with it every tiny verifier's weights, stays as it was.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections import Counter
from pathlib import Path

_HERE = Path(__file__).resolve().parent
REPO = next(p for p in _HERE.parents if (p / "rlexp").is_dir())
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rlexp.config.environment import EnvConfig  # noqa: E402
from rlexp.envs.registry import build_env  # noqa: E402

BASE = {"verifier_frac": 0.25, "train_sums": "held_out"}  # experiment=weaver_cpu's options
CANDIDATES = {
    "weaver_cpu (today)": BASE,
    "weaver_cpu + held_out_min=8 (v18)": {**BASE, "held_out_min": 8},
}


def counts(options: dict) -> dict[str, dict[int, int]]:
    """Per sum: held-out prompts, the policy's training sequences, the verifiers' sequences."""
    env = build_env(EnvConfig(name="arithmetic", options=options))
    train, held = env._split()
    ver = env.verifier_sequences(options.get("verifier_frac", 0.0))
    return {
        "held_out": dict(sorted(Counter(sum(t) for t in held).items())),
        "train": {s: len(v) for s, v in sorted(train.items())},
        "verifier": dict(sorted(Counter(sum(t) for t in ver).items())),
    }


def per_class(run: Path) -> dict[int, dict[str, float]]:
    """step -> {class: greedy accuracy} from a run's eval_samples/train_step*.jsonl."""
    out: dict[int, dict[str, float]] = {}
    for f in sorted((run / "eval_samples").glob("train_step*.jsonl")):
        recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        by: dict[str, list[bool]] = {}
        for r in recs:
            by.setdefault(str(r["gold"]), []).append(bool(r["correct"]))
        step = int(f.stem.removeprefix("train_step"))
        out[step] = {c: sum(v) / len(v) for c, v in sorted(by.items(), key=lambda x: int(x[0]))}
    return out


LEARNED = 0.5  # addendum v18: a class is learned when gold's mean final accuracy on it reaches this


def run_folders(paths: list[Path]) -> list[Path]:
    """Each path itself when it holds eval_samples/, else its subfolders that do (a sweep)."""
    out = []
    for p in paths:
        if (p / "eval_samples").is_dir():
            out.append(p)
        else:
            out += sorted(q for q in p.iterdir() if (q / "eval_samples").is_dir())
    return out


def by_arm(runs: dict[str, dict[int, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """arm -> {"start"|"final": {class: mean over seeds}}, `final` the mean of the last two
    evaluations (the analysis's final), `start` step 0; runs with fewer than two evaluations are
    left out."""
    acc: dict[str, dict[str, list[dict[str, float]]]] = {}
    for run, pc in runs.items():
        steps = sorted(pc)
        if len(steps) < 2:
            continue
        arm = Path(run).name.rsplit("-", 1)[0]
        last = [pc[s] for s in steps[-2:]]
        fin = {c: sum(v[c] for v in last) / len(last) for c in last[-1]}
        acc.setdefault(arm, {"start": [], "final": []})
        acc[arm]["start"].append(pc[steps[0]])
        acc[arm]["final"].append(fin)
    return {arm: {k: {c: sum(d[c] for d in v) / len(v) for c in v[0]} | {"n": len(v)}
                  for k, v in parts.items()} for arm, parts in acc.items()}


def ceiling(path: Path, res: dict) -> list[str]:
    """Each arm's AUC minus gold's, paired by seed, from a weaver_analysis JSON (addendum v18)."""
    sys.path.insert(0, str(_HERE))
    from weaver_analysis import paired_test

    arms = json.loads(path.read_text())["arms"]
    gold = arms["annotated"]["per_seed"]
    out = {}
    for arm, v in arms.items():
        seeds = sorted(set(v["per_seed"]) & set(gold), key=int)
        if arm != "annotated" and seeds:
            out[arm] = paired_test([v["per_seed"][s] for s in seeds], [gold[s] for s in seeds])
    res["vs_gold"] = out
    above = [arm for arm, d in out.items() if d["low"] > 0]
    short = [arm for arm, d in out.items() if d["n"] < 2]
    # fewer than two paired seeds: no interval, so no verdict either way
    res["gold_is_ceiling"] = None if short else not above
    return ["", f"## Gold as a ceiling ({path}): arm minus annotated, AUC, paired by seed", "",
            "| arm | seeds | diff | 95% interval | p |", "|---|---|---|---|---|"] + [
        f"| {arm} | {d['n']} | {d['diff']:+.3f} | [{d['low']:+.3f}, {d['high']:+.3f}] | "
        f"{d['p']:.3g} |" for arm, d in out.items()] + [
        "", "Gold is a ceiling (no arm's interval above 0): "
        + (f"not testable yet ({', '.join(short)}: fewer than 2 seeds paired with gold)" if short
           else "yes" if not above else f"NO: {', '.join(above)}") + "."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", type=Path, default=[])
    ap.add_argument("--ceiling", type=Path, help="a weaver_analysis PREFIX.json: arm - gold")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    cmd = "python studies/weaver/headroom.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    lines = [f"# {'Gold pilot, per class' if a.runs else 'Per-class held-out counts'}", "",
             f"Command: `{cmd}`", ""]
    res: dict = {"command": cmd}
    if not a.runs:
        res["counts"] = {name: counts(o) for name, o in CANDIDATES.items()}
        for name, c in res["counts"].items():
            h = c["held_out"]
            lines += [f"## {name}", "", "| sum | " + " | ".join(map(str, range(10))) + " |",
                      "|---|" + "---|" * 10]
            for part in ("held_out", "train", "verifier"):
                lines.append(f"| {part} | " + " | ".join(str(c[part].get(s, 0)) for s in range(10))
                             + " |")
            lines += ["", f"{len(h)} classes, {sum(h.values())} held-out prompts, smallest class "
                      f"{min(h.values())} (one prompt moves balanced accuracy by "
                      f"{1 / len(h) / min(h.values()):.3f}); a constant answer scores "
                      f"{1 / len(h):.3f} balanced.", ""]
    else:
        res["runs"] = {}
        for run in run_folders(a.runs):
            pc = per_class(run)
            res["runs"][str(run)] = pc
            classes = sorted({c for v in pc.values() for c in v}, key=int)
            lines += [f"## {run}", "", "| step | " + " | ".join(classes) + " | balanced |",
                      "|---|" + "---|" * (len(classes) + 1)]
            for step, v in pc.items():
                bal = sum(v.values()) / len(v)
                lines.append(f"| {step} | " + " | ".join(f"{v.get(c, float('nan')):.2f}"
                                                        for c in classes) + f" | {bal:.3f} |")
            lines.append("")
        arms = by_arm(res["runs"])
        res["by_arm"] = arms
        if arms:
            classes = sorted((c for c in next(iter(arms.values()))["final"] if c != "n"), key=int)
            lines += ["## Per arm: final accuracy per class, mean over seeds (start: step 0)", "",
                      "| arm | seeds | " + " | ".join(classes) + " | balanced |",
                      "|---|---|" + "---|" * (len(classes) + 1)]
            for arm, v in sorted(arms.items()):
                for part in ("start", "final"):
                    d = v[part]
                    lines.append(f"| {arm} ({part}) | {d['n']} | "
                                 + " | ".join(f"{d[c]:.2f}" for c in classes)
                                 + f" | {sum(d[c] for c in classes) / len(classes):.3f} |")
            gold = arms.get("annotated")
            if gold:
                missed = [c for c in classes if gold["final"][c] < LEARNED]
                res["gold_learns_every_class"] = not missed
                lines += ["", f"Gold (annotated) learns every class (final >= {LEARNED} on each): "
                          + ("yes" if not missed else f"NO, not {', '.join(missed)}") + "."]
    if a.ceiling:
        lines += ceiling(a.ceiling, res)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text("\n".join(lines))
    a.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
