"""Writing evaluation outputs: per-sample JSONL, a results table (Markdown + CSV) and the manifest.

Per-sample lines are what make a number auditable: every score can be traced to the prompt, the raw
response, what was extracted, the gold answer and (for shuffled multiple choice) the choice permutation.
"""
from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: the runner imports this module to write samples, so no runtime import back
    from rlexp.evals.runner import BenchmarkResult, SampleRecord

COLUMNS = ("benchmark", "n_problems", "n_samples", "accuracy", "ci_low", "ci_high", "unparseable")


def write_samples(path: str | Path, records: Iterable[SampleRecord]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
    return path


def _columns(results: list[BenchmarkResult]) -> list[str]:
    extra = sorted({k for r in results for k in r.metrics if "@" in k})
    return list(COLUMNS) + extra


def _row(r: BenchmarkResult, cols: list[str]) -> dict[str, str]:
    row = {"benchmark": r.name}
    for c in cols[1:]:
        v = r.metrics.get(c)
        row[c] = "" if v is None else (str(int(v)) if c.startswith("n_") else f"{v:.4f}")
    return row


def write_tables(out_dir: str | Path, results: list[BenchmarkResult], header: str = "") -> tuple[Path, Path]:
    """`results.md` (for people) and `results.csv` (for scripts) with one row per benchmark."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cols = _columns(results)
    rows = [_row(r, cols) for r in results]
    with (out / "results.csv").open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    lines = [header.rstrip() + "\n"] if header else []
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row[c] for c in cols) + " |" for row in rows]
    lines.append("\naccuracy: mean over all samples; ci: 95% Wilson interval over problems; "
                 "unparseable: share of responses with no extractable answer.")
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "results.md", out / "results.csv"
