"""studies/multi_token/table.py: its statistics on run folders written here (not run), so a
mistake in the pairing, the interval or the live/product fallback shows before a table is read."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

STUDY = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("multi_token_table", STUDY / "table.py")
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


def _folder(root: Path, name: str, start: float, end: float, live: float | None = None) -> Path:
    """A finished run: evaluations at steps 0, 10 and 30 (partial credit = exact + 0.5), and
    steps 1-30."""
    run = root / name / "runs" / "train" / "2026-12-06_00-00-00"
    run.mkdir(parents=True)
    rows = []
    for step, acc in ((0, start), (10, -1.0), (30, end)):
        row = {"step": step, "eval/accuracy": acc, "eval/partial_credit": acc + 0.5,
               "eval/ci_low": acc - 0.1, "eval/ci_high": acc + 0.1}
        if live is not None:
            row |= {"eval/live/accuracy": live, "eval/live/partial_credit": live + 0.5}
        rows.append(row)
    rows += [{"step": s, "policy/entropy": 5.0 - s / 10, "policy/kl_to_start": s / 100,
              "reward/mean": s / 30} for s in range(1, 31)]
    rows.sort(key=lambda r: r["step"])
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (root / name / "done").touch()
    return root / name


def test_read_run_takes_first_and_last_evaluation_and_falls_back_to_the_product(tmp_path: Path):
    r = table.read_run(_folder(tmp_path, "a", start=0.1, end=0.4))
    assert r["last_step"] == 30 and r["has_live"] is False
    assert (r["eval/accuracy@start"], r["eval/accuracy@end"]) == (0.1, 0.4)
    assert r["eval/partial_credit@end"] == pytest.approx(0.9)
    # no weight average: the live policy is the product
    assert r["eval/live/accuracy@end"] == 0.4
    assert (r["policy/entropy@first"], r["policy/entropy@last"]) == (4.9, 2.0)
    assert r["eval/ci_low@end"] == pytest.approx(0.3)
    with_live = table.read_run(_folder(tmp_path, "b", start=0.1, end=0.4, live=0.7))
    assert with_live["has_live"] is True and with_live["eval/live/accuracy@end"] == 0.7
    (tmp_path / "c").mkdir()
    assert table.read_run(tmp_path / "c") is None  # unfinished: no `done`, nothing read


def _runs(ends: dict[tuple[str, int], float]) -> dict[tuple[str, str, int], dict]:
    return {("sort", arm, s): {"eval/accuracy@end": v} for (arm, s), v in ends.items()}


def test_contrast_pairs_by_seed_with_a_t_interval():
    runs = _runs({("multi_token", 0): 0.5, ("multi_token", 1): 0.6, ("multi_token", 2): 0.4,
                  ("warmup_only", 0): 0.3, ("warmup_only", 1): 0.3, ("warmup_only", 2): 0.3})
    seeds, d = table.contrast(runs, "sort", "multi_token", "warmup_only", "eval/accuracy")
    assert seeds == [0, 1, 2]
    # differences 0.2, 0.3, 0.1: mean 0.2, sd 0.1, half-width t(2 df) 4.3027 x 0.1 / sqrt(3)
    assert d.mean == pytest.approx(0.2) and d.n == 3
    assert d.half == pytest.approx(4.3027 * 0.1 / math.sqrt(3), rel=1e-4)
    assert d.covers_zero()  # 0.248 > 0.2: with 3 seeds a consistent difference can still cover 0


def test_contrast_uses_only_seeds_both_arms_finished():
    runs = _runs({("multi_token", 0): 0.5, ("multi_token", 2): 0.4,
                  ("warmup_only", 0): 0.3, ("warmup_only", 1): 0.9, ("warmup_only", 2): 0.6})
    seeds, d = table.contrast(runs, "sort", "multi_token", "warmup_only", "eval/accuracy")
    assert seeds == [0, 2]
    assert d.mean == pytest.approx(0.0)  # 0.2 and -0.2
    assert d.covers_zero()
    none = table.contrast(runs, "reverse", "multi_token", "warmup_only", "eval/accuracy")
    assert none == ([], None)


def test_tables_show_every_contrast_and_live_rows_only_for_a_weight_average(tmp_path: Path):
    runs = {}
    for s in table.SEEDS:
        runs[("reverse", "default", s)] = table.read_run(_folder(tmp_path, f"d{s}", 0.0, 0.01 * s))
        runs[("reverse", "warmup_only", s)] = table.read_run(
            _folder(tmp_path, f"w{s}", 0.2, 0.2 + 0.01 * s))
        runs[("reverse", "multi_token", s)] = table.read_run(
            _folder(tmp_path, f"m{s}", 0.2, 0.2 + 0.01 * s, live=0.3))
    md = table.tables(runs)
    rows = md.splitlines()
    assert not [r for r in rows if r.startswith("| reverse | warmup_only |") and "live" in r]
    assert [r for r in rows if r.startswith("| reverse | multi_token | 3 | eval/live/accuracy |")]
    # warm-up minus default: 0.2 at every seed (no spread), the RL settings: 0 at every seed
    assert ("| reverse | eval/accuracy | warmup_only - default (its warm-up) | 0, 1, 2 "
            "| 0.200 ± 0.000 (interval excludes 0) |") in rows
    assert ("| reverse | eval/accuracy | multi_token - warmup_only (its RL settings) | 0, 1, 2 "
            "| 0.000 ± 0.000 (interval covers 0) |") in rows
    assert [r for r in rows if "eval/live/accuracy | multi_token - warmup_only" in r]
    assert not [r for r in rows if "eval/live/accuracy | multi_token - default" in r]
    # each run's own exact match with its Wilson interval; the live one only beside a weight average
    assert "| reverse_warmup_only_s0 | 30 | 0.200 [0.100, 0.300] | (the product) |" in rows
    assert "| reverse_multi_token_s1 | 30 | 0.210 [0.110, 0.310] | 0.300 |" in rows
