"""studies/scaling/scaling.py: the fit functions on data with a known answer, every point of the
grid through rlexp's own config validation, and (slow) the sweep machinery on a two-point sub-grid
of real `rlexp train` runs, whose report must be built from what those runs measured."""
from __future__ import annotations

import importlib.util
import json
import math
import random
import statistics as st
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def scaling():
    """studies/scaling/scaling.py as a module, registered under its name so its dataclasses find
    their module."""
    spec = importlib.util.spec_from_file_location(
        "scaling", Path(__file__).resolve().parents[1] / "scaling.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["scaling"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_fit_line_recovers_a_known_line(scaling) -> None:
    xs = [1.0, 4.0, 16.0, 64.0]
    b, a, r2 = scaling.fit_line(xs, [0.3 + 0.05 * x for x in xs])
    assert (b, a, r2) == pytest.approx((0.05, 0.3, 1.0))
    rng = random.Random(0)
    noisy = [0.3 + 0.05 * x + rng.gauss(0, 0.2) for x in xs]
    b, a, r2 = scaling.fit_line(xs, noisy)
    # Against the closed form computed independently: slope = cov(x, y) / var(x).
    mx, my = st.mean(xs), st.mean(noisy)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, noisy)) / sum((x - mx) ** 2 for x in xs)
    assert b == pytest.approx(slope) and a == pytest.approx(my - slope * mx)
    assert 0.9 < r2 < 1.0
    with pytest.raises(ValueError, match="two distinct x"):
        scaling.fit_line([2.0, 2.0], [1.0, 3.0])


def test_fit_power_recovers_a_known_exponent(scaling) -> None:
    dims = [128.0, 256.0, 512.0, 1024.0]
    k, c, r2 = scaling.fit_power(dims, [2e-6 * d ** 1.7 for d in dims])
    assert (k, c, r2) == pytest.approx((1.7, 2e-6, 1.0))
    k, _, r2 = scaling.fit_power(dims, [1.0, 1.0, 1.0, 1.0])  # flat cost: exponent 0
    assert k == pytest.approx(0.0, abs=1e-12) and r2 == 1.0
    with pytest.raises(ValueError, match="positive"):
        scaling.fit_power(dims, [1.0, 0.0, 1.0, 2.0])


def test_every_grid_point_passes_rlexp_validation(scaling) -> None:
    """Widths keep head_dim 64 (n_heads = dim/64, hidden = 2 dim); long answers turn eos off."""
    points = [(axis, v) for axis, values in scaling.GRID.items() for v in values]
    scaling.check_configs(points, [], steps=6)
    assert scaling.axis_overrides("width", 1024)[:3] == [
        "model.arch.dim=1024",
        "model.arch.n_heads=16",
        "model.arch.hidden_dim=2048",
    ]
    assert "generator.ignore_eos=true" in scaling.axis_overrides("tokens", 64)
    with pytest.raises(ValueError, match="multiple of head_dim"):
        scaling.axis_overrides("width", 100)


def test_short_answers_are_refused(scaling, tmp_path: Path) -> None:
    """A length point whose responses stopped early must not enter the table as that length."""
    rows = [
        {
            "step": s,
            "time/train_step_s": 1.0,
            "time/generate_s": 1.0,
            "time/score_s": 0.1,
            "time/weight_sync_s": 0.1,
            "time/step_s": 2.3,
            "response/len_mean": 15.5 if s == 2 else 16.0,
        }
        for s in (1, 2, 3)
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (tmp_path / scaling.SAMPLES).write_text(
        json.dumps(
            {
                "overrides": [],
                "peak_rss_kib": {r: 1 for r in scaling.ROLES},
                "load_1m": [1.0],
                "wall_s": 9.0,
            }
        )
    )
    with pytest.raises(RuntimeError, match="cut short"):
        scaling.row_from_runs("tokens", 16, [tmp_path], 1)
    # the same run is fine where length is free
    row = scaling.row_from_runs("group", 16, [tmp_path], 1)
    assert (row.step_s, row.steps_measured, row.len_mean) == (2.3, 2, 15.75)


@pytest.mark.slow  # two real `rlexp train` runs of 2 steps: ~50 s on 2 idle cores
@pytest.mark.soak  # its parts run in CI elsewhere (tests/test_train_e2e.py's runs, the fits above)
def test_sub_grid_sweep_reports_what_the_runs_measured(scaling, tmp_path: Path) -> None:
    base = ["algorithm.prompts_per_step=8", "algorithm.group_size=4"]
    rows = scaling.sweep(
        {"tokens": [1, 3]}, base, steps=2, warmup=1, runs_dir=tmp_path / "runs", log=lambda m: None
    )
    assert [(r.axis, r.value) for r in rows] == [("tokens", 1), ("tokens", 3)]
    for r in rows:
        assert len(r.run_dirs) == 1
        metrics = [
            json.loads(x) for x in (Path(r.run_dirs[0]) / "metrics.jsonl").read_text().splitlines()
        ]
        last = [m for m in metrics if "time/train_step_s" in m][1:]  # after the one warm-up step
        assert r.step_s == st.median(m["time/step_s"] for m in last) > 0
        assert r.stages["train"] == st.median(m["time/train_step_s"] for m in last)
        # ignore_eos reached the generator process: answers are full length
        assert r.len_mean == r.value
        # a torch process is > 100 MiB
        assert all(r.rss_mib[role] > 100 for role in scaling.ROLES), r.rss_mib
        assert r.params_m == pytest.approx(0.33, abs=0.01)
    md, fitted = scaling.write_report(
        rows,
        tmp_path / "report",
        "python studies/scaling/scaling.py ...",
        {"steps": 2, "warmup": 1, "base": base},
    )
    text = md.read_text()
    for r in rows:
        assert f"| {r.value} | 0.33 | {r.step_s:.3f} | {r.stages['generate']:.3f} |" in text
    step_fit = next(
        f for f in fitted if f.quantity == "step_s" and f.law == "line" and f.x == "tokens"
    )
    b, a, _ = scaling.fit_line([1.0, 3.0], [rows[0].step_s, rows[1].step_s])
    assert (step_fit.slope, step_fit.intercept) == pytest.approx((b, a)) and not math.isnan(b)
    assert scaling.fit_table([step_fit], "tokens")[2] in text  # the fitted law's row in the report
    assert (tmp_path / "report.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "report.json").read_text())
    assert [r["step_s"] for r in saved["rows"]] == [r.step_s for r in rows]
