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

from rlexp.core.runfolder import nofollow_opener

if TYPE_CHECKING:  # types only: the runner imports this module to write samples, so no runtime import back
    from rlexp.evals.runner import BenchmarkResult, SampleRecord

COLUMNS = ("benchmark", "n_problems", "n_samples", "accuracy", "ci_low", "ci_high",
           "partial_credit", "unparseable")


def write_samples(path: str | Path, records: Iterable[SampleRecord]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", opener=nofollow_opener) as f:  # never through a planted link
        for r in records:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
    return path


def _columns(results: list[BenchmarkResult]) -> list[str]:
    """Every column of results.csv: the base metrics, pass@n/maj@n (with their intervals when selection ran),
    then, with `selection=...`, each mode's accuracy/interval/gap, the oracle's choice and each verifier's rates."""
    keys = list(dict.fromkeys(k for r in results for k in r.metrics))
    at = sorted(k for k in keys if "@" in k and "/" not in k and "_ci_" not in k)
    plain = [c for k in at for c in (k, f"{k}_ci_low", f"{k}_ci_high") if c in keys]
    select = [k for k in keys if k.startswith("select/")]
    best = ["best_verifier"] if any(r.selection is not None and r.selection.best_verifier for r in results) else []
    # every verifier's columns, blank where there is no value (a dropped verifier has no Weaver estimate)
    verifiers = list(dict.fromkeys(
        f"verifier/{v.name}/{c}" for r in results if r.selection is not None for v in r.selection.verifiers
        for c in ("weaver_tpr", "tpr", "weaver_fpr", "fpr", "accuracy", f"select@{r.selection.n}", "dropped")))
    return list(COLUMNS) + plain + select + best + verifiers


def _fmt(c: str, v: float | None) -> str:
    if v is None:
        return ""
    return str(int(v)) if c.rsplit("/", 1)[-1].startswith("n_") else f"{v:.4f}"


def _row(r: BenchmarkResult, cols: list[str]) -> dict[str, str]:
    row = {"benchmark": r.name}
    for c in cols[1:]:
        if c == "best_verifier":
            row[c] = (r.selection.best_verifier or "") if r.selection is not None else ""
        else:
            row[c] = _fmt(c, r.metrics.get(c))
    return row


def _table(cols: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + ["| " + " | ".join(r) + " |" for r in rows]


def _selection_md(results: list[BenchmarkResult]) -> list[str]:
    """Two tables: each mode's selection accuracy beside pass@n and accuracy@1 (the gap is pass@n minus it), and each
    verifier's Weaver-estimated TPR/FPR beside the ones measured against gold."""
    sel = [r for r in results if r.selection is not None]
    if not sel:
        return []
    from rlexp.evals.selection import MODES, ORACLE_NOTE

    ns = sorted({r.selection.n for r in sel})
    n_txt = "/".join(map(str, ns))
    out = ["", f"## Test-time selection: one of n={n_txt} responses per problem", ""]
    rows = []
    for r in sel:
        rep, k, m = r.selection, f"@{r.selection.n}", r.metrics
        pk = m.get(f"pass{k}")
        rows.append([r.name, f"pass{k} (some response is correct: the ceiling)", _fmt("", pk),
                     _fmt("", m.get(f"pass{k}_ci_low")), _fmt("", m.get(f"pass{k}_ci_high")), _fmt("", 0.0)])
        for mode in rep.modes:
            label = mode
            if mode == "best_verifier":
                label = f"best_verifier = {rep.best_verifier}: {ORACLE_NOTE}"
            key = f"select/{mode}{k}"
            rows.append([r.name, label, _fmt("", m.get(key)), _fmt("", m.get(f"{key}/ci_low")),
                         _fmt("", m.get(f"{key}/ci_high")), _fmt("", m.get(f"{key}/gap"))])
        acc = m.get("accuracy")
        rows.append([r.name, "accuracy@1 (one response at random)", _fmt("", acc), _fmt("", m.get("ci_low")),
                     _fmt("", m.get("ci_high")), _fmt("", None if pk is None or acc is None else pk - acc)])
    out += _table(["benchmark", "selection", "accuracy", "ci_low", "ci_high", f"gap (pass@{n_txt} - accuracy)"], rows)
    modes = list(dict.fromkeys(mode for r in sel for mode in r.selection.modes))
    out += ["", "Selectors see the problems and the responses only; gold (the environment's check) only scores their "
            "picks, measures the verifiers and makes the oracle choice. Ties go to the first response. Modes: "
            + "; ".join(f"{mode}: {MODES[mode]}" for mode in modes) + "."]
    vrows = []
    for r in sel:
        rep = r.selection
        for v in rep.verifiers:
            vrows.append([r.name, v.name, v.status, _fmt("", v.weaver_tpr), _fmt("", v.tpr), _fmt("", v.weaver_fpr),
                          _fmt("", v.fpr), _fmt("", v.accuracy), _fmt("", v.select_accuracy)])
    if vrows:
        sets = ", ".join(sorted({str(r.selection.verifier_set) for r in sel if r.selection.verifiers}))
        out += ["", f"## Verifiers (verifier_set {sets}): Weaver's estimates beside the rates measured on gold", ""]
        out += _table(["benchmark", "verifier", "status", "weaver_tpr", "tpr", "weaver_fpr", "fpr", "accuracy",
                       f"select@{n_txt}"], vrows)
        notes = []
        for r in sel:
            prior = r.metrics.get("select/weaver/prior")
            if prior is not None:
                notes.append(f"{r.name}: Weaver's estimated P(correct) {prior:.4f} vs measured accuracy@1 "
                             f"{r.metrics['accuracy']:.4f}, {int(r.metrics.get('select/weaver/n_active', 0))} "
                             f"verifiers active")
            elif r.metrics.get("select/weaver/fallback"):
                notes.append(f"{r.name}: fewer than 3 verifiers active, so Weaver fell back to their mean vote "
                             f"(no label model, no estimated rates)")
        out += ["", "tpr/fpr: the verifier's binarised vote (Weaver's threshold) against gold, P(vote | correct) and "
                "P(vote | wrong); weaver_*: the label model's estimates, fit without gold (blank when dropped); "
                "accuracy: P(vote = gold); select@n: accuracy of the verifier's own pick (its highest score)."]
        out += [f"- {x}" for x in notes]
    return out


def write_tables(out_dir: str | Path, results: list[BenchmarkResult], header: str = "",
                 command: str = "") -> tuple[Path, Path]:
    """`results.md` (for people) and `results.csv` (for scripts) with one row per benchmark; with selection,
    results.md adds a selection table and a verifier table, and results.csv their numbers as columns. `command`
    ends results.csv as a comment row, so the file says what made it (read with comment='#')."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cols = _columns(results)
    rows = [_row(r, cols) for r in results]
    with (out / "results.csv").open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
        if command:
            f.write(f"# produced by: {command}\n")
    md_cols = [c for c in cols if "/" not in c and "_ci_" not in c and c != "best_verifier"]
    lines = [header.rstrip() + "\n"] if header else []
    lines += _table(md_cols, [[row[c] for c in md_cols] for row in rows])
    lines.append("\naccuracy: mean over all samples; ci: 95% Wilson interval over problems; "
                 "unparseable: share of responses with no extractable answer.")
    lines += _selection_md(results)
    (out / "results.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out / "results.md", out / "results.csv"
