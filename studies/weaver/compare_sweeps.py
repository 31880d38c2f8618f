"""Is a whole table the same runs when regenerated from a fresh clone? (issue 46 item 2, v18)

    python studies/weaver/compare_sweeps.py SWEEP/H REGEN/H \
        --out studies/weaver/results/headroom_regen

Every cell (run folder) of the first sweep against the one of the same name in the second, by
compare_cells.py's test: evaluation files byte for byte, every non-timing metric at every step, the
start checkpoint's and the verifiers' sha256. Exit status 1 when a cell differs or is missing.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_cells import compare  # a sibling script, not a package


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="the sweep the committed table was made from")
    ap.add_argument("b", type=Path, help="the same sweep regenerated")
    ap.add_argument("--out", type=Path, required=True)
    x = ap.parse_args()
    cmd = "python studies/weaver/compare_sweeps.py " + " ".join(map(shlex.quote, sys.argv[1:]))
    names = sorted({p.name for p in x.a.iterdir() if p.is_dir()}
                   | {p.name for p in x.b.iterdir() if p.is_dir()})
    cells = {}
    for name in names:
        if not (x.a / name).is_dir() or not (x.b / name).is_dir():
            cells[name] = {"identical": False, "missing": True}
            continue
        r = compare(x.a / name, x.b / name)
        cells[name] = {"identical": r["identical"], "eval_files": len(r["eval_files"]),
                       "eval_files_same": sum(r["eval_files"].values()),
                       "metric_keys_differing": r["metric_keys_differing"]}
    same = sum(c["identical"] for c in cells.values())
    res = {"command": cmd, "cells": cells, "identical": same, "of": len(cells)}
    x.out.parent.mkdir(parents=True, exist_ok=True)
    x.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    lines = ["# A whole table regenerated", "", f"Command: `{cmd}`", "",
             "| cell | identical | evaluation files byte-identical | metrics differing |",
             "|---|---|---|---|"]
    for name, c in cells.items():
        if c.get("missing"):
            lines.append(f"| {name} | MISSING on one side | | |")
        else:
            lines.append(f"| {name} | {'yes' if c['identical'] else 'NO'} | "
                         f"{c['eval_files_same']} of {c['eval_files']} | "
                         f"{', '.join(c['metric_keys_differing']) or 'none'} |")
    lines += ["", f"**{same} of {len(cells)} cells identical**", ""]
    x.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if same == len(cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
