"""A task with headroom (issue 46 item 3): per-class held-out counts of the arithmetic evaluation,
and per-class greedy accuracy of run folders (the gold pilot), without any RL of its own.

    python studies/weaver/headroom.py --out studies/weaver/results/headroom_counts
    python studies/weaver/headroom.py --runs /tmp/h46/pilot/annotated-100 ... \\
        --out studies/weaver/results/headroom_pilot

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="*", type=Path, default=[])
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
        for run in a.runs:
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
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text("\n".join(lines))
    a.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
