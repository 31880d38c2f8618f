"""`rlexp compare` over real run folders (files written here the way the trackers write them), the
metrics.jsonl comparison used by reproduce/resume, and the reproduce command built from a manifest."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.tracking.base import JsonlTracker, Trackers
from rlexp.tracking.compare import main as compare_main
from rlexp.tracking.manifest import read_manifest, write_start_manifest
from rlexp.tracking.reproduce import build_command, compare_metrics, first_difference, main as reproduce_main


def _make_run(run: Path, reward: str, seed: int, accs: list[float], lr: float = 1e-5) -> None:
    cfg = OmegaConf.create({"seed": seed, "reward": {"name": reward}, "algorithm": {"lr": lr, "group_size": 8},
                            "paths": {"run_dir": str(run)}})
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (run / ".hydra" / "overrides.yaml").write_text(f"- reward={reward}\n- seed={seed}\n")
    manifest = write_start_manifest(run, cfg, ["rlexp", "train", f"reward={reward}", f"seed={seed}"],
                                    {"global": seed}, {}, repo_dir=run)
    with Trackers([JsonlTracker()], cfg, run, manifest) as tr:
        for step, acc in enumerate(accs):
            tr.log({"reward/mean": acc / 2, "loss": 1.0 - acc, "time/wall_s": 10.0 * step,
                    "throughput/tokens_per_s": 100.0 + step}, step)
            tr.log({"eval/accuracy": acc, "time/wall_s": 10.0 * step}, step)


def test_compare_two_run_folders(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    _make_run(a, "rule", 0, [0.1, 0.4, 0.3])
    _make_run(b, "weaver", 0, [0.2, 0.5, 0.6])
    out = tmp_path / "out"
    assert compare_main([str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| rank | configuration | n | eval/accuracy final (↑) | eval/accuracy auc (↑) |" in printed
    assert "| 1 | reward.name=weaver | 1 | 0.6 | 0.45 |" in printed
    with open(out / "compare.csv") as f:
        rows = list(csv.DictReader(f))
    # sorted by the first headline (held-out accuracy, final): weaver first
    assert [r["configuration"] for r in rows] == ["reward.name=weaver", "reward.name=rule"]
    assert "seed" not in rows[0] and "algorithm.lr" not in rows[0] and not any(k.startswith("paths") for k in rows[0])
    assert rows[1]["eval/accuracy final mean"] == "0.3" and rows[1]["eval/accuracy final ±95%"] == ""  # n=1
    assert rows[0]["eval/accuracy auc mean"] == "0.45"  # trapezoid (0.35 + 0.55) / 2 steps
    assert rows[0]["time/wall_s final mean"] == "20" and rows[0]["status"] == "completed"
    assert not any("loss" in k for k in rows[0])  # raw loss is no headline
    with open(out / "runs.csv") as f:
        runs = list(csv.DictReader(f))
    assert [r["run"] for r in runs] == ["reward=rule,seed=0", "reward=weaver,seed=0"]  # named by overrides
    for name in ("reward_mean_vs_step", "reward_mean_vs_wall", "eval_accuracy_vs_step", "eval_accuracy_vs_wall"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a runs root holding both folders is expanded like a sweep dir
    assert compare_main([str(tmp_path / "runs"), "--out", str(tmp_path / "out2")]) == 0
    with open(tmp_path / "out2" / "compare.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
    assert compare_main([str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert compare_main([str(a), "--metrics", "eval/accuracy:median", "--out", str(out)]) == 2
    assert "statistic 'median' is not one of final, best, auc" in capsys.readouterr().err


def test_compare_metrics_first_difference(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"

    def write(p: Path, rows: list[dict]) -> None:
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))

    base = [{"step": s, "loss": 1.0 / (s + 1), "reward/mean": 0.1 * s, "kl_beta": 0.01} for s in range(4)]
    write(a, base)
    timing = [dict(r, **{"time/step_s": 9.9, "throughput/tok_per_s": 5.0, "gen_tokens_per_s": 1.0, "eta_s": 3.0})
              for r in base]
    write(b, timing)
    assert compare_metrics(a, b) is None  # timing keys ignored
    changed = [dict(r) for r in base]
    changed[2]["reward/mean"] = 0.2000001
    changed[3]["loss"] = 7.0
    write(b, changed)
    d = first_difference(a, b)
    assert (d.step, d.metric, d.a, d.b) == (2, "reward/mean", 0.2, 0.2000001)
    msg = compare_metrics(a, b)
    assert "step 2" in msg and "reward/mean" in msg
    write(b, [dict(r, kl_beta=0.02) if r["step"] == 1 else r for r in base])  # `beta` is not a timing key
    assert first_difference(a, b).metric == "kl_beta"
    write(b, base[:3])
    d = first_difference(a, b)
    assert d.metric == "<missing line>" and d.step == 3
    write(b, [dict(r, extra=1.0) if r["step"] == 0 else r for r in base])
    assert first_difference(a, b).metric == "extra"
    write(a, [{"step": 0, "loss": float("nan")}])
    write(b, [{"step": 0, "loss": float("nan")}])
    assert compare_metrics(a, b) is None


def test_reproduce_reruns_with_same_overrides(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "a"
    _make_run(run, "weaver", 3, [0.1, 0.2])
    cmd = build_command(read_manifest(run), tmp_path / "new", ["seed=4"])
    assert cmd[:5] == [sys.executable, "-P", "-m", "rlexp", "train"]
    assert cmd[5:] == ["reward=weaver", "seed=4", f"hydra.run.dir={tmp_path / 'new'}"]

    # A value the run derived from its machine (threads) is pinned as recorded; one the run set stays its own.
    m = read_manifest(run)
    m.config["cluster"] = {"threads_per_proc": 2}
    assert build_command(m, tmp_path / "new")[-2] == "cluster.threads_per_proc=2"
    assert "cluster.threads_per_proc=2" not in build_command(m, tmp_path / "new", ["cluster.threads_per_proc=1"])

    calls = []

    def fake_train(cmd: list[str], cwd=None) -> int:  # stands in for the real train subprocess
        calls.append(cmd)
        new = Path(cmd[-1].split("=", 1)[1])
        new.mkdir(parents=True)
        rows = (run / "metrics.jsonl").read_text().splitlines()
        if len(calls) == 2:  # second reproduction drifts at step 1
            rows[2] = json.dumps({**json.loads(rows[2]), "reward/mean": 0.5})
        (new / "metrics.jsonl").write_text("\n".join(rows) + "\n")
        return 0

    assert reproduce_main([str(run)], runner=fake_train) == 0
    new_dir = Path(calls[0][-1].split("=", 1)[1])
    assert new_dir.parent == run.parent / "reproduce" and calls[0][5:7] == ["reward=weaver", "seed=3"]
    assert reproduce_main([str(run)], runner=fake_train) == 1
    assert reproduce_main([str(run)], runner=lambda c, cwd=None: 3) == 2


def test_ranking_follows_declared_direction_and_one_run_read_twice_is_not_two_seeds(tmp_path: Path) -> None:
    from rlexp.tracking.compare import compare
    from rlexp.tracking.verdict import direction

    assert [direction(m) for m in ("eval/accuracy", "reward/mean", "loss", "eval/unparseable", "time/wall_s",
                                   "policy/version")] == ["max", "max", "min", "min", "min", None]
    a, b, c = (tmp_path / "runs" / n for n in ("a", "b", "c"))
    _make_run(a, "rule", 0, [0.1, 0.4, 0.3])
    _make_run(b, "rule", 1, [0.1, 0.4, 0.3])
    _make_run(c, "weaver", 0, [0.2, 0.5, 0.6])
    for run, unparse in ((a, [0.5, 0.1, 0.3]), (b, [0.5, 0.1, 0.3]), (c, [0.9, 0.8, 0.7])):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        for r in rows:
            r["eval/unparseable"] = unparse[r["step"]]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = compare([str(tmp_path / "runs")], tmp_path / "out", metrics=["eval/unparseable:best", "policy/version"])
    head, rows = res["header"], {r[1]: r for r in res["rows"]}
    # ranked by the first headline, lower is better for unparseable answers: rule (0.1 best) first
    assert [r[1] for r in res["rows"]] == ["reward.name=rule", "reward.name=weaver"]
    assert rows["reward.name=rule"][head.index("eval/unparseable best mean")] == "0.1"
    assert rows["reward.name=weaver"][head.index("eval/unparseable best mean")] == "0.7"
    assert "policy/version final not declared" in res["notes"][2]
    assert res["verdict"].sentence.startswith("Best configuration by eval/unparseable (best, lower is better): "
                                              "reward.name=rule")
    # the same run twice (another source of the same sweep): not two seeds of one configuration
    res = compare([str(a), str(a)], tmp_path / "out2")
    assert len(res["configurations"]) == 2 and all(len(c.runs) == 1 for c in res["configurations"])
    assert len({r[0] for r in res["run_rows"]}) == 2


def test_reproduce_on_a_different_machine_says_so_and_checks_tolerance(tmp_path: Path, capsys) -> None:
    from rlexp.tracking.files import atomic_write_json
    from rlexp.tracking.system import numerics_differences, numerics_info

    here = numerics_info(torch_probe=False)
    other = {**here, "cpu_model": "Other CPU 9000", "cpu_flags": [*here["cpu_flags"], "zz_made_up_flag"],
             "cpu_flags_sha256": "0" * 64}
    diffs = numerics_differences(other, here)
    assert any("cpu_model" in d and "Other CPU 9000" in d for d in diffs)
    assert any("instruction-set flags" in d and "zz_made_up_flag" in d for d in diffs)
    assert numerics_differences(here, here) == []

    run = tmp_path / "runs" / "a"
    _make_run(run, "rule", 0, [0.1, 0.2, 0.3, 0.4])
    m = json.loads((run / "manifest.json").read_text())
    assert m["system"]["numerics"]["cpu_flags"] == here["cpu_flags"]  # recorded at start
    m["system"]["numerics"] = other
    atomic_write_json(run / "manifest.json", m)
    seen_before_start = []

    def rerun(drift: float):
        def fake_train(cmd: list[str], cwd=None) -> int:  # stands in for the real train subprocess
            seen_before_start.append(capsys.readouterr().out)
            new = Path(cmd[-1].split("=", 1)[1])
            new.mkdir(parents=True)
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            for r in rows[2:]:
                if "reward/mean" in r:
                    r["reward/mean"] += drift
            (new / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            return 0
        return fake_train

    assert reproduce_main([str(run)], runner=rerun(0.01)) == 1
    assert "differs from the run's in what decides bitwise identity" in seen_before_start[0]
    assert "Other CPU 9000" in seen_before_start[0]
    out = capsys.readouterr().out
    assert "first difference at line 3, step 1, metric 'reward/mean'" in out
    assert "curves agree within tolerance 0.05" in out
    assert reproduce_main([str(run)], runner=rerun(0.5)) == 1
    assert "curves do NOT agree within tolerance" in capsys.readouterr().out


def test_t_quantiles_match_scipy() -> None:
    from rlexp.tracking.stats import estimate, t975

    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 5, 29, 30, 31, 60, 200):
        assert t975(df) == pytest.approx(float(scipy_stats.t.ppf(0.975, df)), abs=2e-4)
    e = estimate([0.3, 0.35, 0.4])
    lo, hi = scipy_stats.t.interval(0.95, 2, loc=0.35, scale=scipy_stats.sem([0.3, 0.35, 0.4]))
    assert (e.low, e.high, e.n) == (pytest.approx(lo, abs=1e-4), pytest.approx(hi, abs=1e-4), 3)
    assert estimate([0.5]).half is None and estimate([0.5]).covers_zero()


def _sweep(root: Path, finals: dict[str, list[float]], logger=None) -> None:
    """Runs of configurations `reward` x seeds; eval/accuracy climbs to the given final value per seed."""
    job = 0
    for reward, per_seed in finals.items():
        for seed, final in enumerate(per_seed):
            if logger is None:
                _make_run(root / str(job), reward, seed, [final / 3, final / 2, final])
            else:
                logger(root / str(job), reward, seed, [final / 3, final / 2, final])
            job += 1


def test_configurations_average_seeds_and_the_winner_is_paired(tmp_path: Path) -> None:
    from rlexp.tracking.compare import compare
    from rlexp.tracking.stats import estimate

    _sweep(tmp_path / "clear", {"rule": [0.30, 0.35, 0.40], "weaver": [0.60, 0.62, 0.69]})
    res = compare([str(tmp_path / "clear")], tmp_path / "out")
    head, rows = res["header"], res["rows"]
    assert [r[1] for r in rows] == ["reward.name=weaver", "reward.name=rule"] and len(res["runs"]) == 6
    assert rows[0][head.index("n")] == "3" and rows[0][head.index("seeds")] == "0 1 2"
    e = estimate([0.60, 0.62, 0.69])
    assert rows[0][head.index("eval/accuracy final mean")] == f"{e.mean:.4g}"
    assert rows[0][head.index("eval/accuracy final ±95%")] == f"{e.half:.4g}"
    assert head.index("eval/accuracy final mean") < head.index("eval/accuracy auc mean") \
        < head.index("reward/mean final mean") < head.index("time/wall_s final mean")
    v = res["verdict"]
    d = estimate([0.30, 0.27, 0.29])  # weaver - rule, per seed
    assert v.best.label == "reward.name=weaver" and v.paired_seeds == [0, 1, 2] and v.distinguishable
    assert v.difference.mean == pytest.approx(d.mean) and v.difference.half == pytest.approx(d.half)
    assert "Runner-up: reward.name=rule" in v.sentence and v.sentence.endswith(": distinguishable.")
    from rlexp.tracking.compare import mean_curve

    xs, ys, halves = mean_curve(v.best, "eval/accuracy", "wall")
    assert xs == [0.0, 10.0, 20.0] and ys[-1] == pytest.approx(e.mean) and halves[-1] == pytest.approx(e.half)
    assert mean_curve(v.best, "eval/accuracy", "step")[0] == [0.0, 1.0, 2.0]
    md = (tmp_path / "out" / "compare.md").read_text()
    assert md.startswith("**Best configuration by eval/accuracy (final, higher is better): reward.name=weaver")
    # seed noise larger than the gap: the interval on paired differences covers zero
    _sweep(tmp_path / "noisy", {"rule": [0.30, 0.60, 0.35], "weaver": [0.60, 0.35, 0.45]})
    v = compare([str(tmp_path / "noisy")], tmp_path / "out2")["verdict"]
    assert v.best.label == "reward.name=weaver" and not v.distinguishable
    assert "not distinguishable (the interval covers zero)" in v.sentence
    # one seed each: no interval, no claim
    _sweep(tmp_path / "one", {"rule": [0.3], "weaver": [0.6]})
    v = compare([str(tmp_path / "one")], tmp_path / "out3")["verdict"]
    assert "(n=1, no interval)" in v.sentence and "Not distinguishable: they share fewer than 2 seeds" in v.sentence


def test_same_verdict_from_folder_mlflow_and_wandb(tmp_path: Path, offline_trackers: None) -> None:
    from rlexp.tracking.compare import compare
    from rlexp.tracking.mlflow_tracker import local_store_uri
    from rlexp.tracking.registry import build_trackers
    from tests.mlflow_store import fresh_store

    fresh_store(tmp_path / "runs" / "mlruns" / "mlflow.db")  # empty, without the migrations

    def logged(run: Path, reward: str, seed: int, accs: list[float]) -> None:
        cfg = OmegaConf.create({
            "seed": seed, "reward": {"name": reward},
            "logger": {"wandb": {"enabled": True, "mode": "offline", "project": "rlexp-test", "entity": None},
                       "mlflow": {"enabled": True, "tracking_uri": None, "experiment": "cmp"},
                       "log_every_n_steps": 1, "rollout_samples": 0, "runs_root": str(tmp_path / "runs")}})
        m = write_start_manifest(run, cfg, ["rlexp", "train", f"reward={reward}", f"seed={seed}"], {"global": seed},
                                 {}, repo_dir=run.parent)
        with build_trackers(cfg.logger, cfg, run, m) as tr:
            for step, acc in enumerate(accs):
                tr.log({"reward/mean": acc / 2, "eval/accuracy": acc, "time/wall_s": float(step)}, step)

    _sweep(tmp_path / "runs" / "sw", {"rule": [0.30, 0.35], "weaver": [0.60, 0.62]}, logger=logged)
    sources = {"folder": str(tmp_path / "runs" / "sw"), "mlflow": "mlflow:cmp", "wandb": f"wandb:{tmp_path / 'runs'}"}
    got = {}
    for name, spec in sources.items():
        res = compare([spec], tmp_path / name, tracking_uri=local_store_uri(tmp_path / "runs"))
        v = res["verdict"]
        got[name] = ([c.label for c in res["configurations"]], [len(c.runs) for c in res["configurations"]],
                     v.paired_seeds, round(v.difference.mean, 6), v.distinguishable)
    # two paired seeds: the difference is shown, never called distinguishable
    # (tests/test_sweep_verdicts.py)
    want = (["reward.name=weaver", "reward.name=rule"], [2, 2], [0, 1], 0.285, False)
    assert got["folder"] == want
    assert got["mlflow"] == got["folder"] and got["wandb"] == got["folder"]


def test_a_tie_says_so_and_the_next_headline_orders_it(tmp_path: Path) -> None:
    from rlexp.tracking.compare import compare

    _sweep(tmp_path / "tie", {"weaver": [0.5, 0.5], "rule": [0.5, 0.5]})
    for job in ("0", "1"):  # weaver's runs took twice the wall time
        p = tmp_path / "tie" / job / "metrics.jsonl"
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        p.write_text("".join(json.dumps({**r, "time/wall_s": 2 * r["time/wall_s"]}) + "\n" for r in rows))
    v = compare([str(tmp_path / "tie")], tmp_path / "out")["verdict"]
    assert [c.label for c in v.ranked] == ["reward.name=rule", "reward.name=weaver"]
    assert "Tied on this metric; ordered by eval/accuracy auc, reward/mean final, time/wall_s final." in v.sentence
    assert "not distinguishable" in v.sentence


def test_band_stays_within_what_the_metric_can_take() -> None:
    """Seen on a real 2-seed sweep: the t-interval of held-out accuracy spanned [-0.9, 1.2] and the band hid
    the curves. A fraction's band is cut to [0, 1]; a reward (any range) keeps its whole interval."""
    from rlexp.tracking.compare import band

    assert band("eval/accuracy", [0.1, 0.9], [0.5, 0.3]) == ([0.0, pytest.approx(0.6)], [pytest.approx(0.6), 1.0])
    assert band("reward/mean", [0.1], [0.5]) == ([pytest.approx(-0.4)], [pytest.approx(0.6)])
    assert band("eval/accuracy", [0.5], [None]) == ([0.5], [0.5])  # n=1 at a step: no band
