"""No gold through the back door: a label-free verifier sees only `Problem`s (id, prompt, meta), and the
multiple-choice environments must not let it compute the gold letter from them.

The old GPQA order was a public function of (id, shuffle_seed) applied to the source order, whose index 0 is
the correct answer, so recomputing it gave the gold letter every time. Here (a) a verifier that tries every
public route it has (the old permutation, fixed letters, the current ordering rule, scanning meta) is scored
against a binomial 99% interval around chance, on the GPQA fixture and on generated data in GPQA's (and
MMLU-Pro's) schema, with a positive control showing the same verifier and interval do catch the old order;
(b) the shown order is reproducible and depends on the choice texts only; (c) `Problem.meta` holds nothing
that equals or encodes the gold letter: the whole `Problem` is the same whichever choice the source marks
correct.
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from fractions import Fraction
from itertools import accumulate
from math import comb
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from rlexp.envs.multiple_choice import LETTERS, format_choices
from rlexp.envs.registry import build_env
from rlexp.evals.benchmarks import env_config
from rlexp.rewards.base import strip_gold
from rlexp.types import Problem, Sample

FIX = Path(__file__).parent / "fixtures"
CONF = Path(__file__).resolve().parents[1] / "conf" / "environment"
GPQA_COLUMNS = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                "Incorrect Answer 3", "High-level domain"]
CONFIG_SEED = 0  # what a verifier reads from the run manifest (gpqa.yaml's options.shuffle_seed)


def env_from_yaml(name: str, **over):
    return build_env(env_config(OmegaConf.merge(OmegaConf.load(CONF / f"{name}.yaml"), over)))


def gpqa(path: Path, **options):
    return env_from_yaml("gpqa", dataset=str(path), **({"options": options} if options else {}))


# --- the attacker -------------------------------------------------------------------------------------
def old_permutation(question_id: str, shuffle_seed: int, n: int) -> list[int]:
    """The pre-fix public rule (rlexp/envs/multiple_choice.py::permutation), as an attacker re-implements it:
    `perm[j]` is the source index shown as LETTERS[j]; source index 0 is GPQA's correct answer."""
    seed = int.from_bytes(hashlib.sha256(f"{shuffle_seed}:{question_id}".encode()).digest()[:8], "big")
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    return perm


def _n(p: Problem) -> int:
    return len(p.meta["choices"])


def _meta_letter(p: Problem, seed: int) -> str:
    """A letter sitting in meta outside the choice table, if any (a careless environment's leak)."""
    found = [v.strip("() ") for k, v in p.meta.items() if k != "choices" and isinstance(v, str)]
    found = [v for v in found if len(v) == 1 and v in LETTERS[:_n(p)]]
    return found[0] if found else "A"


def _key_rank(p: Problem, seed: int, pick) -> str:
    """Recompute the current rule (keyed hash of each shown text) and pick a letter by its hash."""
    keys = {k: hashlib.sha256(f"{seed}:{p.id}:{t}".encode()).digest() for k, t in p.meta["choices"].items()}
    return pick(keys, key=keys.get)


# Each strategy sees one Problem and the config seed (from the run manifest, or meta if an env put it there).
STRATEGIES = {
    "old permutation: letter where source index 0 went":
        lambda p, seed: LETTERS[old_permutation(p.id, seed, _n(p)).index(0)],
    "old permutation read the other way": lambda p, seed: LETTERS[old_permutation(p.id, seed, _n(p))[0]],
    "always the last letter": lambda p, seed: LETTERS[_n(p) - 1],
    "current rule: smallest keyed hash": lambda p, seed: _key_rank(p, seed, min),
    "current rule: largest keyed hash": lambda p, seed: _key_rank(p, seed, max),
    "a letter found in meta": _meta_letter,
}  # plus "always (X)" for every valid letter X, added by `attack`


def binomial_99(n: int, p: Fraction) -> tuple[int, int]:
    """Two-sided 99% acceptance interval [lo, hi] of Binomial(n, p): P(X < lo) <= 0.005, P(X > hi) <= 0.005."""
    cdf = list(accumulate(comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)))
    lo = next(k for k in range(n + 1) if cdf[k] > Fraction(5, 1000))
    hi = next(k for k in range(n + 1) if cdf[k] >= Fraction(995, 1000))
    return lo, hi


def attack(env, samples: list[Sample], seed: int = CONFIG_SEED, view=strip_gold) -> dict[str, tuple[int, int, int]]:
    """Hits of each strategy, run on what a label-free verifier receives (`view`: strip_gold), scored by the env."""
    problems = view(samples)
    assert all(type(p) is Problem for p in problems)
    n_choices = {_n(p) for p in problems}
    assert len(n_choices) == 1, "chance level needs one number of choices"
    n = n_choices.pop()
    lo, hi = binomial_99(len(problems), Fraction(1, n))
    fixed = {f"always ({x})": (lambda p, seed, x=x: x) for x in LETTERS[:n]}
    out = {}
    for name, guess in {**STRATEGIES, **fixed}.items():
        hits = sum(env.check(s, f"The answer is ({guess(p, int(p.meta.get('shuffle_seed', seed)))}).").correct
                   for s, p in zip(samples, problems))
        out[name] = (hits, lo, hi)
    return out


def assert_chance(results: dict[str, tuple[int, int, int]], n: int) -> None:
    bad = {k: v for k, v in results.items() if not v[1] <= v[0] <= v[2]}
    assert not bad, f"strategies outside the 99% chance interval (hits, lo, hi) over {n} questions: {bad}"


# --- data -------------------------------------------------------------------------------------------------
def _word(rng: random.Random) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                    for _ in range(rng.randint(1, 4)))


def synthetic_rows(n: int = 480, seed: int = 20240611) -> list[dict]:
    """GPQA-schema rows, correct answer first as in the real file; every 20th row repeats an incorrect
    answer (GPQA Diamond has such rows), the correct text is never repeated (chance stays 1/4)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        texts: list[str] = []
        while len(texts) < 4:
            t = _word(rng)
            if t not in texts:
                texts.append(t)
        if i % 20 == 7:
            texts[3] = texts[2]
        domain = rng.choice(["Physics", "Chemistry", "Biology"])
        rows.append({"Record ID": f"recSYN{i:04d}", "Question": f"Synthetic question {i}: {_word(rng)}?",
                     "Correct Answer": texts[0], "Incorrect Answer 1": texts[1], "Incorrect Answer 2": texts[2],
                     "Incorrect Answer 3": texts[3], "High-level domain": domain})
    return rows


def write_gpqa(path: Path, rows: list[dict]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=GPQA_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def fixture_rows() -> list[dict]:
    with (FIX / "gpqa_diamond.csv").open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def old_style_samples(rows: list[dict], seed: int | None = CONFIG_SEED) -> list[Sample]:
    """What the pre-fix GPQA loader produced (positive control for the attacker and the interval); with
    seed=None, the unshuffled source order."""
    out = []
    for r in rows:
        choices = [r["Correct Answer"]] + [r[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        perm = old_permutation(r["Record ID"], seed, 4) if seed is not None else [0, 1, 2, 3]
        shown = [choices[i] for i in perm]
        meta = {"choices": {LETTERS[j]: c for j, c in enumerate(shown)}}
        if seed is not None:
            meta["shuffle_seed"] = seed  # the old loader put it there
        out.append(Sample(Problem(r["Record ID"], format_choices(shown), meta), LETTERS[perm.index(0)]))
    return out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    return write_gpqa(tmp_path_factory.mktemp("gpqa") / "synthetic.csv", synthetic_rows())


# --- (a) no better than chance ------------------------------------------------------------------------------
def test_binomial_interval():
    assert binomial_99(5, Fraction(1, 4)) == (0, 4)  # 5/5 has probability 1/1024 < 0.005
    lo, hi = binomial_99(480, Fraction(1, 4))
    assert lo < 120 < hi and hi - lo < 70


def test_verifier_is_at_chance_on_gpqa_fixture():
    env = gpqa(FIX / "gpqa_diamond.csv")
    samples = env.eval_samples()
    assert len(samples) == 5
    assert_chance(attack(env, samples), len(samples))


def test_verifier_is_at_chance_on_synthetic_gpqa(synthetic):
    env = gpqa(synthetic)
    samples = env.eval_samples()
    assert len(samples) >= 400
    assert_chance(attack(env, samples), len(samples))
    for seed in (1, 12345):  # any config seed, the verifier told it (it is in the manifest)
        env = gpqa(synthetic, shuffle_seed=seed)
        assert_chance(attack(env, env.eval_samples(), seed), len(samples))


def test_verifier_is_at_chance_on_packaged_diamond():
    """The real 198 questions (read from the installed data package; nothing of them is written here)."""
    env = env_from_yaml("gpqa")
    samples = env.eval_samples()
    assert len(samples) == 198
    assert_chance(attack(env, samples), len(samples))


def test_attack_catches_the_old_order(synthetic):
    """Positive control: the same verifier and interval flag the pre-fix order (and the raw source order) when it
    sees the problems as the pre-fix reward layer passed them (ids included); the id strip alone defeats the
    old order's attack, which needs the Record ID."""
    env = gpqa(synthetic)  # only its check() is used, which scores by letter here
    unstripped = lambda samples: [s.problem for s in samples]  # noqa: E731 - the pre-fix view
    for rows in (fixture_rows(), synthetic_rows()):
        old = old_style_samples(rows)
        hits, _, hi = attack(env, old, view=unstripped)["old permutation: letter where source index 0 went"]
        assert hits == len(old) and hits > hi
        hits, lo, hi = attack(env, old)["old permutation: letter where source index 0 went"]
        assert lo <= hits <= hi  # what a label-free verifier gets today: no Record ID, no route
        unshuffled = old_style_samples(rows, seed=None)  # source order: the correct answer is always (A)
        hits, _, hi = attack(env, unshuffled)["always (A)"]
        assert hits == len(old) and hits > hi


def test_verifier_is_at_chance_on_shuffled_mmlu_pro(tmp_path):
    """MMLU-Pro with options.shuffle_seed, on data whose correct option is always first (the worst source
    bias): the text-keyed order removes it too."""
    rng = random.Random(7)
    path = tmp_path / "mmlu_pro.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(400):
            options = list(dict.fromkeys(_word(rng) for _ in range(12)))[:10]
            assert len(options) == 10
            f.write(json.dumps({"question_id": 50000 + i, "question": f"Q{i}?", "options": options, "answer": "A",
                                "answer_index": 0, "category": "math", "src": "synthetic"}) + "\n")
    env = env_from_yaml("mmlu_pro", dataset=str(path), options={"shuffle_seed": 0})
    samples = env.eval_samples()
    assert_chance(attack(env, samples), len(samples))


# --- (b) deterministic, and a function of the choice texts only ----------------------------------------------
def _shown(p: Problem) -> list[str]:
    return re.findall(r"^\([A-Z]\) (.*)$", p.prompt, flags=re.M)


def test_order_is_the_documented_keyed_hash_of_the_texts():
    for s in gpqa(FIX / "gpqa_diamond.csv").eval_samples():
        texts = list(s.problem.meta["choices"].values())
        assert texts == _shown(s.problem)
        assert texts == sorted(texts, key=lambda t: hashlib.sha256(f"0:{s.id}:{t}".encode()).digest())


def test_order_is_identical_across_loads_and_processes(synthetic):
    a = [s.problem for s in gpqa(synthetic).eval_samples()]
    assert a == [s.problem for s in gpqa(synthetic).eval_samples()]
    code = ("import hashlib, sys; from omegaconf import OmegaConf; from rlexp.envs.registry import build_env; "
            "from rlexp.evals.benchmarks import env_config; "
            f"e = build_env(env_config(OmegaConf.merge(OmegaConf.load({str(CONF / 'gpqa.yaml')!r}), "
            f"{{'dataset': {str(synthetic)!r}}}))); "
            "print(hashlib.sha256(repr([(s.problem, s.answer) for s in e.eval_samples()]).encode()).hexdigest())")
    digest = hashlib.sha256(repr([(s.problem, s.answer) for s in gpqa(synthetic).eval_samples()]).encode()).hexdigest()
    for hash_seed in ("0", "4242"):  # another process, another str-hash randomisation
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": hash_seed})
        assert out.stdout.strip() == digest


def test_source_column_order_does_not_change_the_problem(tmp_path):
    rows = fixture_rows() + synthetic_rows(60)
    base = {s.id: s for s in gpqa(write_gpqa(tmp_path / "base.csv", rows)).eval_samples()}
    rng = random.Random(3)
    permuted = []
    for r in rows:  # the incorrect answers in another order
        wrong = [r[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        rng.shuffle(wrong)
        permuted.append({**r, **{f"Incorrect Answer {i + 1}": w for i, w in enumerate(wrong)}})
    for s in gpqa(write_gpqa(tmp_path / "permuted.csv", permuted)).eval_samples():
        assert s.problem == base[s.id].problem and s.answer == base[s.id].answer


def test_mmlu_pro_source_order_does_not_change_the_shuffled_problem(tmp_path):
    rows = [json.loads(x) for x in (FIX / "mmlu_pro.jsonl").read_text().splitlines() if x.strip()]
    rng = random.Random(5)
    moved = []
    for r in rows:
        idx = list(range(len(r["options"])))
        rng.shuffle(idx)
        new_correct = idx.index(r["answer_index"])
        moved.append({**r, "options": [r["options"][i] for i in idx], "answer_index": new_correct,
                      "answer": LETTERS[new_correct]})
    path = tmp_path / "moved.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in moved))
    a = env_from_yaml("mmlu_pro", dataset=str(FIX / "mmlu_pro.jsonl"), options={"shuffle_seed": 5}).eval_samples()
    b = env_from_yaml("mmlu_pro", dataset=str(path), options={"shuffle_seed": 5}).eval_samples()
    assert [(s.problem, s.answer) for s in a] == [(s.problem, s.answer) for s in b]


# --- (c) nothing in Problem encodes the gold letter ---------------------------------------------------------
def _scalars(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _scalars(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _scalars(v)
    else:
        yield value


def _all_samples(synthetic: Path):
    yield "gpqa fixture", gpqa(FIX / "gpqa_diamond.csv").eval_samples(), {"choices", "domain"}
    yield "gpqa synthetic", gpqa(synthetic).eval_samples(), {"choices", "domain"}
    for opts in ({}, {"shuffle_seed": 5}):
        env = env_from_yaml("mmlu_pro", dataset=str(FIX / "mmlu_pro.jsonl"), **({"options": opts} if opts else {}))
        yield f"mmlu_pro {opts}", env.eval_samples(), {"choices", "category"}


def test_meta_holds_nothing_gold_like(synthetic):
    for name, samples, keys in _all_samples(synthetic):
        strip_gold(samples)  # the reward layer's own check
        for s in samples:
            meta = s.problem.meta
            assert set(meta) == keys, name  # no shuffle_seed, permutation, answer, ...
            # the choice table is exactly what the prompt shows, letter by letter
            assert list(meta["choices"]) == list(LETTERS[:len(meta["choices"])])
            assert list(meta["choices"].values()) == _shown(s.problem), name
            gold_index = LETTERS.index(s.answer)
            for v in _scalars({k: v for k, v in meta.items() if k != "choices"}):
                assert v not in (s.answer, s.answer.lower(), f"({s.answer})", gold_index), (name, s.id, v)


def test_problem_is_the_same_whichever_choice_is_correct(tmp_path):
    """The strongest form of (c): move the 'Correct Answer' label to each of the other choices in turn; the
    Problems (prompt and meta) stay identical while the gold letter follows the label, so no function of a
    Problem can pick out the gold letter."""
    rows = fixture_rows() + synthetic_rows(40)
    base = gpqa(write_gpqa(tmp_path / "base.csv", rows)).eval_samples()
    golds = [{s.answer} for s in base]
    for k in (1, 2, 3):
        swapped = [{**r, "Correct Answer": r[f"Incorrect Answer {k}"], f"Incorrect Answer {k}": r["Correct Answer"]}
                   for r in rows]
        samples = gpqa(write_gpqa(tmp_path / f"swap{k}.csv", swapped)).eval_samples()
        assert [s.problem for s in samples] == [s.problem for s in base]
        for g, s, r in zip(golds, samples, swapped):
            assert s.problem.meta["choices"][s.answer] == r["Correct Answer"]
            g.add(s.answer)
    # rows whose four texts differ: the four labellings put the gold on four different letters
    assert all(len(g) == len({r["Correct Answer"], *(r[f"Incorrect Answer {i}"] for i in (1, 2, 3))})
               for g, r in zip(golds, rows))


def test_duplicate_choice_texts(tmp_path):
    """Identical texts are indistinguishable in the prompt: the order among copies carries nothing, and when
    the correct text is duplicated every copy scores (which copy the source marked is unknowable)."""
    rows = [{"Record ID": "recDUP1", "Question": "Q1?", "Correct Answer": "same", "Incorrect Answer 1": "same",
             "Incorrect Answer 2": "other", "Incorrect Answer 3": "third", "High-level domain": "Physics"},
            {"Record ID": "recDUP2", "Question": "Q2?", "Correct Answer": "right", "Incorrect Answer 1": "twin",
             "Incorrect Answer 2": "twin", "Incorrect Answer 3": "solo", "High-level domain": "Physics"}]
    env = gpqa(write_gpqa(tmp_path / "dup.csv", rows))
    s1, s2 = env.eval_samples()
    copies = [k for k, t in s1.problem.meta["choices"].items() if t == "same"]
    assert len(copies) == 2 and s1.answer == copies[0]
    assert all(env.check(s1, f"The answer is ({k})").correct for k in copies)
    assert not any(env.check(s1, f"The answer is ({k})").correct for k in "ABCD" if k not in copies)
    assert env.record(s1)["choice_permutation"].index(0) == LETTERS.index(s1.answer)
    assert s2.problem.meta["choices"][s2.answer] == "right"
    assert [env.check(s2, f"The answer is ({k})").correct for k in "ABCD"].count(True) == 1
    flipped = [{**rows[0], "Incorrect Answer 1": "other", "Incorrect Answer 2": "same"},
               {**rows[1], "Incorrect Answer 1": "solo", "Incorrect Answer 3": "twin"}]
    again = gpqa(write_gpqa(tmp_path / "dup2.csv", flipped)).eval_samples()
    assert [(s.problem, s.answer) for s in again] == [(s1.problem, s1.answer), (s2.problem, s2.answer)]


def test_mmlu_pro_dataset_order_adds_no_back_door():
    """Default MMLU-Pro keeps the published order: Problem holds the options as published and the category,
    no seed or permutation; in the fixture (as in the dataset) the correct option is not at a fixed position.
    Scoring stays letter-only, as in the official evaluation."""
    env = env_from_yaml("mmlu_pro", dataset=str(FIX / "mmlu_pro.jsonl"))
    samples = env.eval_samples()
    rows = [json.loads(x) for x in (FIX / "mmlu_pro.jsonl").read_text().splitlines() if x.strip()]
    for s, r in zip(samples, rows):
        assert _shown(s.problem) == [o.strip() for o in r["options"]]
        assert set(s.problem.meta) == {"choices", "category"}
        assert env.record(s)["choice_permutation"] == list(range(len(r["options"])))
    assert len({s.answer for s in samples}) == len(samples)  # five questions, five different gold positions
    assert not env.orders_by_text()


# --- (d) ids: an environment's id may encode the answer, a label-free verifier never sees it ---------------
class _Recorder:
    """A test-only verifier that keeps every Problem it is given."""

    def __init__(self, name: str) -> None:
        self.name, self.kind, self.seen = name, "rule", []

    def score(self, problems, texts):
        self.seen.extend(problems)
        return np.zeros(len(texts))


def test_ids_are_stripped_before_label_free_verifiers():
    """The guess game's id is "<game>/<digit>": the hidden digit. Every label-free reward hands its verifiers
    opaque ids that still group a problem's responses, so majority voting works and nothing else survives."""
    from rlexp.config.reward import RewardConfig, VerifierConfig
    from rlexp.rewards.registry import build_reward

    env = env_from_yaml("arithmetic")
    samples = [Sample(Problem(id=f"KQZ/{d}", prompt="KQZ:"), answer=str(d)) for d in (3, 3, 7, 7)]
    for name in ("weaver", "verifier_mean", "single_rm"):
        combine = {"verifier_mean": "mean"}.get(name)
        cfg = RewardConfig(name="single_rm" if name == "single_rm" else "weaver",
                           options={"combine": combine} if combine else {},
                           verifiers=[VerifierConfig(name=f"v{i}", kind="format")
                                      for i in range(1 if name == "single_rm" else 3)])
        reward = build_reward(cfg, env)
        rec = _Recorder("rec")
        reward.verifiers[0] = rec
        if hasattr(reward, "verifier"):
            reward.verifier = rec
        reward.score(samples, ["3", "3", "7", "1"], 2)
        assert rec.seen, name
        ids = [p.id for p in rec.seen]
        assert ids == ["problem0", "problem0", "problem1", "problem1"], (name, ids)
        for p in rec.seen:
            assert not any(str(d) in p.id for d in (3, 7)) and p.prompt == "KQZ:" and p.meta == {}
