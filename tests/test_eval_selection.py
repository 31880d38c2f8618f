"""`rlexp eval selection=...`: test-time selection of one of n responses per problem (rlexp/evals/selection.py).

Unit tests of the picking rules on hand-built scores (ties, no parseable answer), of the measurement against
gold (the oracle best_verifier, measured TPR/FPR, the gap to pass@n), of gold isolation, and the command end to
end: on the tiny random policy through the real generator, and on a scripted policy whose error rate is known,
where Weaver must beat a random response and estimate its verifiers' rates close to the measured ones.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import random
import re
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from rlexp.config.environment import EnvConfig
from rlexp.envs.registry import build_env
from rlexp.evals.cli import main
from rlexp.evals.selection import (
    ORACLE_NOTE,
    Selection,
    SelectionError,
    Selector,
    argmax_groups,
    load_verifier_set,
    majority_pick,
    measure,
    parse_modes,
)
from rlexp.types import Completion, Problem, Sample

FIX = Path(__file__).parent / "fixtures"
MODES = ["weaver", "majority", "mean", "best_verifier"]
# The arithmetic environment's held-out problems as a benchmark named `arith`, built from overrides.
ARITH = ["~benchmark", "+benchmark.arith.environment.name=arithmetic", "+benchmark.arith.max_tokens=1"]


# --- picking, no gold -----------------------------------------------------------------------------------------
def test_parse_modes():
    assert parse_modes(None) == [] and parse_modes("none") == [] and parse_modes([]) == []
    assert parse_modes("weaver") == ["weaver"]
    assert parse_modes("[weaver, mean,weaver]") == ["weaver", "mean"]
    assert parse_modes(["majority", "best_verifier"]) == ["majority", "best_verifier"]
    with pytest.raises(SelectionError, match="unknown mode"):
        parse_modes(["weaver", "oracle"])


def test_argmax_groups_ties_go_to_the_first():
    assert argmax_groups([0.1, 0.9, 0.9, 0.2, 0.5, 0.5, 0.5, 0.5], 4) == [1, 0]
    assert argmax_groups([1, 1, 0], 3) == [0]
    assert argmax_groups([0.0, 0.0, 0.3], 1) == [0, 0, 0]


def test_majority_pick_ties_and_no_answer():
    assert majority_pick(["3", "4", "4", "3"]) == 0  # 3 and 4 tie: 3 was seen first
    assert majority_pick([None, "4", "3", "3"]) == 2  # the most common, its first response
    assert majority_pick([None, None, "7"]) == 2  # unparseable responses do not vote
    assert majority_pick([None, None, None]) == 0  # no answer anywhere: the first response


# --- measuring, gold ------------------------------------------------------------------------------------------
def _hand_selection() -> tuple[Selection, list[bool]]:
    """Three problems, n=3. Correct responses: p0 -> 2, p1 -> 0 and 1, p2 -> none."""
    correct = [False, False, True, True, True, False, False, False, False]
    sel = Selection(n=3, modes=["weaver", "majority", "best_verifier"],
                    picks={"weaver": [2, 1, 0], "majority": [0, 0, 0]},
                    verifier_picks={"a": [0, 0, 0], "b": [2, 2, 1], "c": [2, 0, 2]},
                    votes={"a": [1, 1, 1, 1, 1, 1, 1, 1, 1],  # accepts everything: TPR 1, FPR 1
                           "b": [0, 0, 1, 0, 0, 1, 0, 1, 0],  # TPR 1/3, FPR 2/6
                           "c": [0, 0, 1, 1, 0, 0, 0, 0, 1]},  # TPR 2/3, FPR 1/6
                    weaver_metrics={"weaver/b/tpr": 0.4, "weaver/b/fpr": 0.3, "weaver/prior": 0.35},
                    dropped={"a": "constant score 1 over the window (no signal)"})
    return sel, correct


def test_measure_scores_picks_rates_and_the_oracle():
    sel, correct = _hand_selection()
    rep = measure(sel, correct, verifier_set="hand")
    m = rep.metrics
    assert m["select/weaver@3"] == pytest.approx(2 / 3) and m["select/majority@3"] == pytest.approx(1 / 3)
    # the gap is pass@3 (2 of 3 problems have a correct response) minus the selection accuracy
    assert m["select/weaver@3/gap"] == pytest.approx(0.0) and m["select/majority@3/gap"] == pytest.approx(1 / 3)
    assert m["select/weaver@3/ci_low"] < 2 / 3 < m["select/weaver@3/ci_high"]
    assert 0 < m["pass@3_ci_low"] < 2 / 3 < m["pass@3_ci_high"]
    # best_verifier: the verifier whose own pick is right most often (c: 2/3; b: 1/3; a: 1/3)
    assert rep.best_verifier == "c" and rep.picks["best_verifier"] == [2, 0, 2]
    assert m["select/best_verifier@3"] == pytest.approx(2 / 3)
    assert m["verifier/b/tpr"] == pytest.approx(1 / 3) and m["verifier/b/fpr"] == pytest.approx(2 / 6)
    assert m["verifier/c/tpr"] == pytest.approx(2 / 3) and m["verifier/c/fpr"] == pytest.approx(1 / 6)
    assert m["verifier/b/weaver_tpr"] == 0.4 and m["verifier/b/weaver_fpr"] == 0.3
    assert "verifier/a/weaver_tpr" not in m and m["verifier/a/dropped"] == 1.0  # dropped: no estimate
    assert m["select/weaver/prior"] == 0.35
    rows = {r.name: r for r in rep.verifiers}
    assert rows["a"].status.startswith("dropped") and rows["c"].status == "active"
    assert rows["a"].accuracy == pytest.approx(3 / 9)  # accepts all: right on the 3 correct


def test_measure_oracle_ties_go_to_the_first_verifier_and_missing_classes_give_no_rate():
    sel = Selection(n=2, modes=["best_verifier"], picks={}, verifier_picks={"x": [0], "y": [0]},
                    votes={"x": [1, 0], "y": [0, 1]})
    rep = measure(sel, [False, False])  # no correct response at all
    assert rep.best_verifier == "x" and rep.metrics["select/best_verifier@2"] == 0.0
    assert "verifier/x/tpr" not in rep.metrics and rep.metrics["verifier/x/fpr"] == 0.5
    assert rep.metrics["select/best_verifier@2/gap"] == 0.0


# --- selectors on the arithmetic environment --------------------------------------------------------------------
def _arith_env():
    return build_env(EnvConfig(name="arithmetic"))


def _responses(samples: list[Sample], n: int, p_correct: float, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for s in samples:
        for _ in range(n):
            r = rng.random()
            if r < p_correct:
                out.append(s.answer)
            elif r < p_correct + 0.1:
                out.append("x")  # unparseable
            else:
                out.append(rng.choice([d for d in "0123456789" if d != s.answer]))
    return out


def test_selector_never_reads_gold_and_scores_each_verifier_once(monkeypatch):
    env = _arith_env()
    samples = env.eval_samples()[:40]
    n = 4
    texts = _responses(samples, n, 0.4)
    problems = [s.problem for s in samples for _ in range(n)]
    sel = Selector(["weaver", "mean", "vote", "majority"], env, len(samples), load_verifier_set("arithmetic_rules"))
    assert all(not r.needs_gold for r in sel.rewards.values())
    calls: dict[str, int] = {}
    for v in sel.rewards["label_model"].verifiers:
        inner_score = v.inner.score

        def counted(ps, ts, _name=v.name, _f=inner_score):
            calls[_name] = calls.get(_name, 0) + 1
            return _f(ps, ts)

        monkeypatch.setattr(v.inner, "score", counted)

    def no_gold(*a, **k):
        raise AssertionError("selection called env.check (gold)")

    monkeypatch.setattr(env, "check", no_gold)
    with pytest.raises(TypeError, match="Problems"):
        sel.select([s for s in samples for _ in range(n)], texts, n)  # Samples carry gold: refused
    out = sel.select(problems, texts, n)
    assert set(out.picks) == {"weaver", "mean", "vote", "majority"}
    assert all(len(p) == len(samples) for p in out.picks.values())
    assert calls == {name: 1 for name in sel.names}  # three Weaver combines, one scoring per verifier
    # the same problems with other gold answers select alike: nothing gold-dependent reaches the selectors
    again = Selector(["weaver", "mean", "vote", "majority"], env, len(samples),
                     load_verifier_set("arithmetic_rules")).select(
        [Problem(p.id, p.prompt) for p in problems], texts, n)
    assert again.picks == out.picks


def test_weaver_beats_a_random_response_and_estimates_rates_near_the_measured_ones():
    env = _arith_env()
    samples = env.eval_samples()
    n = 8
    texts = _responses(samples, n, 0.4, seed=1)
    sel = Selector(["weaver", "majority", "mean", "best_verifier"], env, len(samples),
                   load_verifier_set("arithmetic_rules"), {"drop_band": [0.02, 0.99]})
    out = sel.select([s.problem for s in samples for _ in range(n)], texts, n)
    correct = [env.check(s, t).correct for s, t in zip([s for s in samples for _ in range(n)], texts)]
    rep = measure(out, correct, verifier_set="arithmetic_rules")
    m = rep.metrics
    acc1 = float(np.mean(correct))
    assert m["select/weaver@8"] > acc1 + 0.3 and m["select/weaver@8"] >= m["select/majority@8"] - 0.05
    for mode in rep.modes:
        assert m[f"select/{mode}@8"] <= m["select/weaver@8"] + m[f"select/{mode}@8/gap"] + 1e-9
    assert rep.best_verifier == "mod5"  # TPR 1, FPR 1/9 (its docstring): the most accurate single check
    for v in rep.verifiers:
        if v.weaver_tpr is not None:
            assert abs(v.weaver_tpr - v.tpr) < 0.1 and abs(v.weaver_fpr - v.fpr) < 0.1, v


def test_verifier_kinds_the_environment_cannot_score_are_refused():
    env = build_env(EnvConfig(name="gsm8k", dataset=str(FIX / "gsm8k.jsonl")))
    with pytest.raises(SelectionError, match="kinds"):
        Selector(["weaver"], env, 4, load_verifier_set("arithmetic_rules"))
    with pytest.raises(SelectionError, match="no verifier set 'nowhere'"):
        load_verifier_set("nowhere")
    assert Selector(["majority"], env, 4).rewards == {}  # majority needs no verifier set


# --- the command ------------------------------------------------------------------------------------------------
def test_cli_refuses_selection_without_several_responses(capsys, tmp_path):
    rc = main(["model=tiny", *ARITH, "n=1", "selection=weaver", "verifier_set=arithmetic_rules",
               "--out", str(tmp_path / "a")])
    assert rc == 2 and "n>=2" in capsys.readouterr().err
    rc = main(["model=tiny", *ARITH, "n=2", "selection=[weaver,best]", "--out", str(tmp_path / "b")])
    assert rc == 2 and "unknown mode" in capsys.readouterr().err


def _tiny_set_available() -> bool:
    return importlib.util.find_spec("rlexp.rewards.verifiers.tiny") is not None


def _check_outputs(out: Path, bench: str, n: int, modes: list[str], verifiers: list[str]) -> dict[str, str]:
    row = next(csv.DictReader((out / "results.csv").open()))
    pass_k = float(row[f"pass@{n}"])
    for mode in modes:
        acc = float(row[f"select/{mode}@{n}"])
        assert 0.0 <= acc <= pass_k + 1e-9, (mode, acc, pass_k)
        assert float(row[f"select/{mode}@{n}/gap"]) == pytest.approx(pass_k - acc, abs=2e-4)
        assert float(row[f"select/{mode}@{n}/ci_low"]) <= acc <= float(row[f"select/{mode}@{n}/ci_high"])
    assert row[f"select/majority@{n}"] == row[f"maj@{n}"]  # majority selection is maj@n
    assert row["best_verifier"] in verifiers
    for v in verifiers:
        for col in ("weaver_tpr", "weaver_fpr", "tpr", "fpr"):
            assert f"verifier/{v}/{col}" in row
    md = (out / "results.md").read_text()
    assert "## Test-time selection" in md and ORACLE_NOTE in md and f"| {bench} | accuracy@1" in md
    assert "| weaver_tpr | tpr | weaver_fpr | fpr |" in md
    for mode in modes:
        assert re.search(rf"\| {bench} \| {mode}\b", md), mode
    for v in verifiers:
        assert f"| {bench} | {v} |" in md
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "completed"
    fm = manifest["final_metrics"]
    for mode in modes:
        assert fm[f"eval/{bench}/select/{mode}@{n}"] == pytest.approx(float(row[f"select/{mode}@{n}"]), abs=1e-4)
    assert all(f"eval/{bench}/verifier/{v}/fpr" in fm or f"eval/{bench}/verifier/{v}/tpr" in fm for v in verifiers)
    assert [v["name"] for v in manifest["selection"][bench]["verifiers"]] == verifiers
    lines = [json.loads(x) for x in (out / f"samples_{bench}.jsonl").read_text().splitlines()]
    for mode in modes:  # each mode picked exactly one response per problem
        assert sum(mode in r["extra"]["selection"]["picked_by"] for r in lines) == int(row["n_problems"])
    assert set(lines[0]["extra"]["selection"]["scores"]) == set(verifiers)
    return row


@pytest.mark.parametrize("verifier_set", ["arithmetic_rules", "tiny"])
def test_eval_selection_tiny_policy_end_to_end(tmp_path, verifier_set):
    """The real path: the tiny random policy sampled by the titan backend, verifiers built in-process (< 60 s)."""
    if verifier_set == "tiny" and not _tiny_set_available():
        pytest.skip("rlexp/rewards/verifiers/tiny.py (the tiny reward models) is not in this tree yet")
    names = [v.name for v in load_verifier_set(verifier_set).members]
    out = tmp_path / "out"
    t = time.perf_counter()
    rc = main(["model=tiny", *ARITH, "n=4", "temperature=1.0", "max_samples=24", f"selection=[{','.join(MODES)}]",
               f"verifier_set={verifier_set}", "--out", str(out)])
    assert rc == 0 and time.perf_counter() - t < 60
    _check_outputs(out, "arith", 4, MODES, names)


def test_eval_selection_scripted_policy(tmp_path, monkeypatch):
    """A scripted policy right 40% of the time (the rest: a wrong digit or no answer): through the whole command,
    Weaver's pick must be right far more often than a random response."""
    from tests.test_eval_cli import _fake_run_dir

    class Scripted:
        def __init__(self, tokenizer):
            self.tok = tokenizer

        def generate(self, prompt_ids, n, max_tokens, temperature, seed, stop=None):
            rng = random.Random(seed)
            out = []
            for ids in prompt_ids:
                prompt = self.tok.decode(ids)
                answer = str(sum(int(x) for x in prompt.rstrip("=").split("+")))
                for _ in range(n):
                    r = rng.random()
                    text = (answer if r < 0.4 else "?" if r < 0.5
                            else rng.choice([d for d in "0123456789" if d != answer]))
                    out.append(Completion(ids, self.tok.encode(text), [0.0] * len(text), text, 0))
            return out

    fake = types.ModuleType("rlexp.models.backends")
    fake.build_backend = lambda backend, model_dir, tokenizer, seed, **kw: Scripted(tokenizer)
    monkeypatch.setitem(sys.modules, "rlexp.models.backends", fake)
    out = tmp_path / "out"
    modes = [*MODES, "vote"]
    rc = main([f"run_dir={_fake_run_dir(tmp_path)}", *ARITH, "n=8", "temperature=1.0",
               f"selection=[{','.join(modes)}]", "verifier_set=arithmetic_rules", "--out", str(out)])
    assert rc == 0
    names = [v.name for v in load_verifier_set("arithmetic_rules").members]
    row = _check_outputs(out, "arith", 8, modes, names)
    assert float(row["select/weaver@8"]) > float(row["accuracy"]) + 0.3
    assert float(row["select/weaver@8"]) > 0.9 and row["best_verifier"] == "mod5"
    assert abs(float(row["verifier/mod5/weaver_fpr"]) - float(row["verifier/mod5/fpr"])) < 0.1
