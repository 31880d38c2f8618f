"""Is one cell of a table the same run when redone from a fresh clone? (issue 46 items 2-3, v18)

    python studies/weaver/compare_cells.py SWEEP/H/annotated-0 CLONE_RUN/annotated-0 \\
        --out studies/weaver/results/headroom_clone_cell

Compares two run folders: every evaluation file (eval_samples/*.jsonl: each prompt's response and
verdict) byte for byte, every metrics.jsonl value that is not a timing (`time/*`,
`perf/overlap_efficiency`) for equality, and the start checkpoint's and verifiers' sha256 in the
manifests. Exit status 1 when anything differs.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

TIMING = ("time/", "perf/")  # wall-clock figures: load-dependent by nature


def manifest(run: Path) -> dict:
    m = json.loads((run / "manifest.json").read_text())
    git = m.get("git") or {}
    return {"status": m.get("status"), "start": (m.get("model") or {}).get("sha256"),
            "verifiers": {n: v.get("sha256") for n, v in (m.get("verifiers") or {}).items()},
            "commit": git.get("commit"), "dirty": git.get("dirty"), "repo": git.get("repo")}


def compare(a: Path, b: Path) -> dict:
    ev_a = sorted(p.name for p in (a / "eval_samples").glob("*.jsonl"))
    ev_b = sorted(p.name for p in (b / "eval_samples").glob("*.jsonl"))
    evals = {n: (a / "eval_samples" / n).read_bytes() == (b / "eval_samples" / n).read_bytes()
             for n in ev_a if n in ev_b}
    rows_a = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines() if x.strip()]
    rows_b = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines() if x.strip()]
    keys = sorted({k for r in rows_a + rows_b for k in r if not k.startswith(TIMING)})
    differ = sorted({k for r, s in zip(rows_a, rows_b) for k in keys if r.get(k) != s.get(k)})
    ma, mb = manifest(a), manifest(b)
    same = (ev_a == ev_b and all(evals.values()) and len(rows_a) == len(rows_b) and not differ
            and ma["start"] == mb["start"] and ma["verifiers"] == mb["verifiers"])
    return {"eval_files": evals, "eval_files_only_one_side": sorted(set(ev_a) ^ set(ev_b)),
            "metric_rows": [len(rows_a), len(rows_b)], "metric_keys_compared": len(keys),
            "metric_keys_differing": differ, "manifest": {str(a): ma, str(b): mb},
            "identical": same}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    x = ap.parse_args()
    cmd = "python studies/weaver/compare_cells.py " + " ".join(map(shlex.quote, sys.argv[1:]))
    res = {"command": cmd} | compare(x.a, x.b)
    x.out.parent.mkdir(parents=True, exist_ok=True)
    x.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    ma, mb = res["manifest"][str(x.a)], res["manifest"][str(x.b)]
    lines = [
        "# One cell redone from a fresh clone", "", f"Command: `{cmd}`", "",
        "| | " + str(x.a) + " | " + str(x.b) + " |", "|---|---|---|",
        *(f"| {k} | {ma[k]} | {mb[k]} |" for k in ("status", "start", "commit", "dirty", "repo")),
        "", f"Evaluation files byte-identical: {sum(res['eval_files'].values())} of "
        f"{len(res['eval_files'])} ({', '.join(res['eval_files'])}); only on one side: "
        f"{res['eval_files_only_one_side'] or 'none'}.",
        f"metrics.jsonl: {res['metric_rows'][0]} vs {res['metric_rows'][1]} rows, "
        f"{res['metric_keys_compared']} non-timing keys compared, differing: "
        f"{res['metric_keys_differing'] or 'none'}.",
        f"Verifier hashes equal: {ma['verifiers'] == mb['verifiers']} "
        f"({len(ma['verifiers'])} verifiers).", "",
        f"**{'IDENTICAL' if res['identical'] else 'DIFFERENT'}**", ""]
    x.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if res["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
