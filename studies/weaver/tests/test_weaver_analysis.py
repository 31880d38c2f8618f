"""studies/weaver/weaver_analysis.py, the pre-registered analysis: balanced accuracy gives every
constant answer 1 / classes, Fieller's interval behaves (bounded around the point when the
denominator is clear of zero, unbounded when it is not), and a sweep folder of run records becomes
the table, the JSON and the verdict."""
from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

STUDY = Path(__file__).resolve().parents[1]
REPO = STUDY.parents[1]

sys.path.insert(0, str(STUDY))
import weaver_analysis as wa  # noqa: E402  (the study folder is on sys.path just above)


def test_a_constant_answer_scores_one_over_the_classes():
    golds = [str(s) for s in (1, 2, 3, 3, 4, 4, 4, 4, 5, 5, 6)]
    recs = [{"gold": g, "correct": g == "4"} for g in golds]
    assert wa.balanced(recs) == 1 / 6
    # what plain accuracy would give it
    assert sum(r["correct"] for r in recs) / len(recs) == 4 / 11


def test_fieller_interval():
    rng = random.Random(0)
    den = [1.0 + rng.gauss(0, 0.05) for _ in range(10)]
    num = [0.5 * d + rng.gauss(0, 0.05) for d in den]
    point, lo, hi = wa.fieller(num, den)
    assert lo < point < hi and abs(point - 0.5) < 0.1 and hi - lo < 0.2
    noisy = [rng.gauss(0, 1) for _ in range(5)]  # denominator indistinguishable from zero
    assert wa.fieller(num[:5], noisy)[1:] == (-math.inf, math.inf)


def _write_run(
    root: Path, arm: str, seed: int, acc_by_step: dict[int, float], const: str | None = None
) -> None:
    job = root / f"{arm}_{seed}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra/overrides.yaml").write_text(f"- reward={arm}\n- seed={seed}\n")
    (job / "eval_samples").mkdir()
    golds = [str(1 + i % 8) for i in range(80)]
    rng = random.Random(seed * 100 + len(arm))
    for step, acc in acc_by_step.items():
        lines = []
        for g in golds:
            ok = rng.random() < acc
            ans = const if const is not None else (g if ok else str((int(g) + 1) % 10))
            lines.append(
                json.dumps({"gold": g, "correct": ans == g, "response": ans, "extracted": ans})
            )
        (job / "eval_samples" / f"train_step{step:06d}.jsonl").write_text("\n".join(lines) + "\n")


def test_sweep_to_table_json_and_verdict(tmp_path: Path):
    sweep = tmp_path / "sweep"
    for seed in range(4):
        _write_run(sweep, "single_rm", seed, {0: 0.1, 25: 0.1, 50: 0.1}, const="4")
        _write_run(sweep, "annotated", seed, {0: 0.1, 25: 0.6, 50: 0.9})
        _write_run(sweep, "weaver_paper", seed, {0: 0.1, 25: 0.5, 50: 0.8})
        _write_run(sweep, "verifier_vote", seed, {0: 0.1, 25: 0.2, 50: 0.3})
        _write_run(sweep, "verifier_mean", seed, {0: 0.1, 25: 0.25, 50: 0.35})
    out = tmp_path / "res"
    assert wa.main([str(sweep), "--out", str(out), "--no-selection"]) == 0
    res = json.loads(out.with_suffix(".json").read_text())
    # a constant answer, balanced over sums 1-8
    assert res["arms"]["single_rm"]["auc"]["mean"] == 1 / 8
    assert res["arms"]["single_rm"]["top_share"]["mean"] == 1.0
    g = res["gap_fraction"]
    assert 0.6 < g["point"] < 1.0 and g["low"] < g["point"] < g["high"] and g["n_seeds"] == 4
    assert res["paired"]["verifier_vote"]["low"] > 0 and res["paired"]["verifier_mean"]["p"] < 0.05
    assert res["baselines"]["best_constant_answer"]["balanced"] == 1 / 8
    md = out.with_suffix(".md").read_text()
    assert "Gap fraction closed by weaver_paper" in md and "Fieller" in md
    assert "python studies/weaver/weaver_analysis.py" in md
    assert out.with_suffix(".png").stat().st_size > 0 and out.with_suffix(
        ".csv"
    ).read_text().startswith("# produced")


def _manifest(job: Path, start: str, verifiers: dict[str, str]) -> None:
    (job / "manifest.json").write_text(
        json.dumps(
            {
                "model": {"sha256": start},
                "verifiers": {n: {"sha256": h} for n, h in verifiers.items()},
            }
        )
    )


def test_the_stand_ins_are_named_and_a_sweep_mixing_two_draws_is_refused(tmp_path: Path):
    """Arms paired by seed must start from one checkpoint and score with one panel; the tiny
    stand-ins are trained per machine, so the analysis names the draw and refuses runs of two draws
    together."""
    sweep = tmp_path / "sweep"
    for seed in range(2):
        _write_run(sweep, "annotated", seed, {0: 0.1, 50: 0.9})
        _manifest(sweep / f"annotated_{seed}", "a" * 64, {})
        _write_run(sweep, "single_rm", seed, {0: 0.1, 50: 0.2})
        _manifest(sweep / f"single_rm_{seed}", "a" * 64, {"rm": "b" * 64})
    res = wa.analyse(wa.load_sweep(sweep, None), None)
    assert res["stand_ins"] == {"rm": "b" * 64, "start": "a" * 64}
    assert "rm bbbbbbbbbbbb, start aaaaaaaaaaaa" in wa.markdown({**res, "command": "c"}, "c")
    _manifest(sweep / "single_rm_1", "c" * 64, {"rm": "b" * 64})  # another machine's warm start
    try:
        wa.analyse(wa.load_sweep(sweep, None), None)
    except SystemExit as e:
        assert "start differs" in str(e) and "single_rm_1" in str(e) and "cccccccccccc" in str(e)
    else:
        raise AssertionError("runs from two warm starts were analysed together")


def test_a_manifest_that_is_not_rlexps_is_named(tmp_path: Path):
    sweep = tmp_path / "sweep"
    _write_run(sweep, "annotated", 0, {0: 0.1, 50: 0.9})
    for bad in ("not json", '{"model": "x"}', '{"verifiers": [1, 2]}'):
        (sweep / "annotated_0" / "manifest.json").write_text(bad)
        try:
            wa.load_sweep(sweep, None)
        except SystemExit as e:
            assert "annotated_0/manifest.json: not a run manifest" in str(e)
        else:
            raise AssertionError(f"a manifest reading {bad!r} was accepted")


def _csv(path: Path, rows: list[tuple[str, int, float, float]]) -> None:
    """A committed-style PREFIX.csv: (arm, seed, auc, start) per run, the other columns filler."""
    lines = [
        "# produced by: python studies/weaver/weaver_analysis.py SWEEP --out X; read with "
        "comment='#'",
        "arm,seed,auc_balanced,final_balanced,final_plain,top_share,start_balanced,job",
    ]
    lines += [
        f"{a},{s},{auc:.4f},{auc:.4f},{auc:.4f},0.3000,{st:.4f},/tmp/{a}-{s}"
        for a, s, auc, st in rows
    ]
    path.write_text("\n".join(lines) + "\n")


def test_the_gap_from_the_start_by_hand_and_doing_nothing_scores_zero(tmp_path: Path):
    """Addendum v12: (arm - start) / (gold - start), ratio of paired means. Start 0.6 on every seed,
    gold AUC
    0.8 / 0.75 / 0.85 / 0.8 (gains 0.2, 0.15, 0.25, 0.2: mean 0.2); weaver_paper half of each gain
    -> 0.5, per seed 0.5 each; an arm at the start (0.6) -> 0 exactly; single_rm at 0.2 ends below
    the start:
    -2 on the start scale, so on the registered scale the arm that never moves closes (0.6 - 0.2) /
    (0.8 - 0.2) = 0.667 of the single-RM gap on seed 0, and weaver_paper 0.5 / 0.6 = 0.833."""
    rows = []
    for s, (gold, paper) in enumerate(((0.8, 0.7), (0.75, 0.675), (0.85, 0.725), (0.8, 0.7))):
        rows += [
            ("annotated", s, gold, 0.6),
            ("weaver_paper", s, paper, 0.6),
            ("verifier_mean", s, 0.6, 0.6),
            ("verifier_vote", s, 0.6, 0.6),
            ("single_rm", s, 0.2, 0.6),
        ]
    _csv(tmp_path / "r.csv", rows)
    assert wa.main(["--from-csv", str(tmp_path / "r.csv"), "--out", str(tmp_path / "r")]) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    sg = res["start_gap_fraction"]
    assert abs(sg["weaver_paper"]["point"] - 0.5) < 1e-9
    assert all(abs(v - 0.5) < 1e-9 for v in sg["weaver_paper"]["per_seed"].values())
    # bounded (gold is clear of 0); every seed's ratio is exactly 0.5, so the interval closes on it
    # (to rounding)
    assert (
        0 < sg["weaver_paper"]["low"] <= 0.5 + 1e-9 and 0.5 - 1e-9 <= sg["weaver_paper"]["high"] < 1
    )
    # doing nothing: not met
    assert sg["verifier_mean"]["point"] == 0.0 and sg["verifier_mean"]["low"] <= 0
    assert abs(sg["single_rm"]["point"] - (-2.0)) < 1e-9
    assert abs(res["gap_fraction"]["per_seed"]["0"] - 0.5 / 0.6) < 1e-9
    # doing nothing meets the registered 0.6
    nothing = wa.gap_fraction({0: 0.6}, {0: 0.2}, {0: 0.8})
    assert abs(nothing["point"] - 0.4 / 0.6) < 1e-9
    assert res["gap_fraction"]["point"] > 0.6  # the registered figure is met ...
    # ... the re-based one is not (0.5 < 0.6), so neither goal holds here, and the file says both
    md = (tmp_path / "r.md").read_text()
    assert (
        "Goal re-based" in md
        and "share of the start -> gold gain" in md
        and "Recomputed from" in md
    )
    assert "| weaver_paper | 0.500 [" in md


def test_from_csv_reproduces_the_committed_headline_and_flags_the_degenerate_single_rm(
    tmp_path: Path,
):
    """The committed panel-A CSV regenerates its JSON's figures (to the CSV's four decimals),
    carries the baselines the CSV does not hold, and names single_rm's reward model degenerate
    (static best-of-10 0.125, the constant answer's)."""
    out = tmp_path / "a"
    assert (
        wa.main(
            [
                "--from-csv",
                str(REPO / "studies/weaver/results/weaver_replication.csv"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    new = json.loads(out.with_suffix(".json").read_text())
    old = json.loads((REPO / "studies/weaver/results/weaver_replication.json").read_text())
    for k in ("point", "low", "high"):
        assert abs(new["gap_fraction"][k] - old["gap_fraction"][k]) < 5e-4
    assert abs(new["start_gap_fraction"]["weaver_paper"]["point"] - 0.387) < 5e-3  # issue 46's 0.39
    assert (
        new["degenerate_single_rm"] is True and "DEGENERATE" in out.with_suffix(".md").read_text()
    )
    assert new["baselines"]["best_constant_answer"] == old["baselines"]["best_constant_answer"]
    assert new["goal_met"] is False and new["goal_met_rebased"] is False


def test_a_csv_that_is_not_weaver_analysis_is_named(tmp_path: Path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    try:
        wa.main(["--from-csv", str(tmp_path / "x.csv"), "--out", str(tmp_path / "x")])
    except SystemExit as e:
        assert "not a weaver_analysis CSV" in str(e)
    else:
        raise AssertionError("a foreign CSV was analysed")


def _math_run(root: Path, reward: str, seed: int, acc_by_step: dict[int, float]) -> None:
    """A MATH-style run folder as `rlexp train experiment=qwen3_8b_math` writes it: free-form gold
    answers, most problems their own answer class."""
    golds = [
        r"\frac{1}{2}",
        r"3\sqrt{2}",
        "(1, -2)",
        r"\pi/4",
        "12",
        "x^2+1",
        r"\{1, 3\}",
        "0.25",
    ] * 5
    job = root / f"{reward}-{seed}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra/overrides.yaml").write_text(
        f"- experiment=qwen3_8b_math\n- reward={reward}\n- seed={seed}\n"
    )
    (job / "eval_samples").mkdir()
    for step, acc in acc_by_step.items():
        k = round(acc * len(golds))  # the first k right, the rest answer "7"
        lines = [
            json.dumps(
                {"gold": g, "correct": i < k, "response": "...", "extracted": g if i < k else "7"}
            )
            for i, g in enumerate(golds)
        ]
        (job / "eval_samples" / f"train_step{step:06d}.jsonl").write_text("\n".join(lines) + "\n")


def test_a_math_sweep_with_free_form_answers_and_the_table_presets(tmp_path: Path):
    """Issue 46 item 5: the analysis reads any environment's answers. On a MATH-style sweep (arms
    named as conf/sweeps/weaver_table.yaml names them) --no-balance makes plain accuracy the
    statistic: weaver_paper 0.5 -> 0.7
    -> 0.9 over steps 0/100/200 has AUC (0.6 + 0.8) / 2 = 0.7, gold 0.5 -> 0.9 -> 0.9 has 0.8, so
    the gap from the start is (0.7 - 0.5) / (0.8 - 0.5) = 2/3; single_rm_debiased is the single_rm
    arm and is marked debiased."""
    sweep = tmp_path / "sweep"
    for seed in range(3):
        _math_run(sweep, "weaver_paper", seed, {0: 0.5, 100: 0.7, 200: 0.9})
        _math_run(sweep, "annotated", seed, {0: 0.5, 100: 0.9, 200: 0.9})
        _math_run(sweep, "single_rm_debiased", seed, {0: 0.5, 100: 0.5, 200: 0.5})
        _math_run(sweep, "best_verifier", seed, {0: 0.5, 100: 0.6, 200: 0.6})
    out = tmp_path / "res"
    try:
        wa.main([str(sweep), "--verifier-set", "math", "--out", str(out)])
    except SystemExit as e:
        # the static baseline is the arithmetic task's: refused by name
        assert "pass --no-selection" in str(e)
    else:
        raise AssertionError("the arithmetic static baseline was run on a MATH sweep")
    assert (
        wa.main(
            [
                str(sweep),
                "--verifier-set",
                "math",
                "--no-selection",
                "--no-balance",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.with_suffix(".json").read_text())
    assert set(res["arms"]) == {"single_rm", "best_verifier", "weaver_paper", "annotated"}
    assert res["statistic"].startswith("AUC of plain") and res["single_rm_debiased"] is True
    assert abs(res["arms"]["weaver_paper"]["auc"]["mean"] - 0.7) < 1e-9
    assert abs(res["start_gap_fraction"]["weaver_paper"]["point"] - 2 / 3) < 1e-9
    assert res["start_gap_fraction"]["single_rm"]["point"] == 0.0  # never moved
    # each free-form answer 5 times of 40
    assert res["arms"]["annotated"]["top_share"]["mean"] == 5 / 40
    assert "single_rm had the same per-answer debiasing" in out.with_suffix(".md").read_text()
    rows = out.with_suffix(".csv").read_text().splitlines()
    assert rows[1].endswith(",debiased") and rows[2].startswith("annotated,0,")
    assert all(r.endswith(",1") == r.startswith(("single_rm,", "best_verifier,")) for r in rows[2:])
    # balanced over the run's own answer classes (8 free-form strings) is the same here: each class
    # half right
    assert wa.load_run(sweep / "weaver_paper-0", None)["start"] == 0.5
