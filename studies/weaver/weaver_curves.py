"""Per-arm curves of a Weaver sweep: held-out accuracy and the training reward at every evaluation, mean over seeds
(issue 23: does an arm's reward keep rising while held-out accuracy falls, i.e. is the policy
optimising against its verifiers?). Exploratory: read from the runs of a pre-registered sweep, not
one of its statistics.

    python studies/weaver/weaver_curves.py SWEEP_DIR/E --out studies/weaver/results/weaver_curves_e
"""
from __future__ import annotations

import argparse
import json
import statistics as st
import sys
from pathlib import Path


def curves(run: Path) -> tuple[dict[int, float], dict[int, float]]:
    """Held-out plain accuracy at each evaluation, and the training reward averaged over the steps
    since the last."""
    acc: dict[int, float] = {}
    reward: dict[int, float] = {}
    window: list[float] = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "reward/mean" in m:
            window.append(m["reward/mean"])
        if "eval/accuracy" in m:
            acc[m["step"]] = m["eval/accuracy"]
            if window:
                reward[m["step"]] = st.mean(window)
                window = []
    return acc, reward


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    by: dict[str, list[tuple[dict[int, float], dict[int, float]]]] = {}
    for run in sorted(p for p in a.sweep.iterdir() if (p / "metrics.jsonl").exists()):
        by.setdefault(run.name.rsplit("-", 1)[0], []).append(curves(run))
    steps = sorted({s for runs in by.values() for acc, _ in runs for s in acc})
    res = {
        arm: {
            "seeds": len(runs),
            "accuracy": {s: st.mean(acc[s] for acc, _ in runs if s in acc) for s in steps},
            "reward": {
                s: st.mean(r[s] for _, r in runs if s in r)
                for s in steps
                if any(s in r for _, r in runs)
            },
            "peak_step": [max(acc, key=acc.get) for acc, _ in runs],
        }
        for arm, runs in sorted(by.items())
    }
    cmd = "python studies/weaver/weaver_curves.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    lines = [
        f"Produced by `{cmd}`. Exploratory: mean over seeds of each arm's held-out plain "
        "accuracy (greedy) and of its training reward since the previous evaluation; not a "
        "pre-registered statistic.",
        "",
        "| arm | seeds | "
        + " | ".join(f"acc @ {s}" for s in steps)
        + " | "
        + " | ".join(f"reward to {s}" for s in steps[1:])
        + " | step of each seed's best accuracy |",
        "|---|---|" + "---|" * (2 * len(steps) - 1) + "---|",
    ]
    for arm, r in res.items():
        lines.append(
            f"| {arm} | {r['seeds']} | "
            + " | ".join(f"{r['accuracy'][s]:.3f}" for s in steps)
            + " | "
            + " | ".join(f"{r['reward'].get(s, float('nan')):.3f}" for s in steps[1:])
            + f" | {', '.join(map(str, r['peak_step']))} |"
        )
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    a.out.with_suffix(".json").write_text(
        json.dumps({"command": cmd, "arms": res}, indent=1) + "\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
