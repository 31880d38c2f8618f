"""Environments: loading (fixtures in the real schemas, and the packaged GSM8K/GPQA data), prompts, gold
answers, GPQA's seeded text-keyed choice order, the calculator tool, and the error raised when data is missing."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError

from rlexp.config.environment import EnvConfig
from rlexp.envs.calculator import safe_eval
from rlexp.envs.data import DatasetMissing
from rlexp.envs.multiple_choice import text_order
from rlexp.envs.registry import build_env, env_names
from rlexp.evals.benchmarks import env_config

FIX = Path(__file__).parent / "fixtures"
CONF = Path(__file__).resolve().parents[1] / "conf" / "environment"


def env_yaml(name: str):
    """An environment option's own settings; a `# @package _global_` option (calculator, guess: they also size
    the batch) keeps them under `environment:`."""
    node = OmegaConf.load(CONF / f"{name}.yaml")
    return node.environment if "environment" in node else node


def env_from_yaml(name: str, **over):
    cfg = env_config(OmegaConf.merge(env_yaml(name), over))
    return build_env(cfg)


def test_all_environments_registered_with_yaml():
    for name in ("gsm8k", "math", "gpqa", "mmlu_pro", "calculator", "arithmetic"):
        assert name in env_names()
    for name in ("gsm8k", "math", "gpqa", "mmlu_pro", "calculator", "guess"):
        assert env_yaml(name).name == name


def test_math_fixture_prompt_gold_and_check():
    env = env_from_yaml("math", dataset=str(FIX / "math.jsonl"))
    samples = env.eval_samples()
    assert len(samples) == 6 and samples[0].id == "fixture/prealgebra/1.json"
    assert "\\boxed{}" in samples[0].problem.prompt and "\\frac{3}{6}" in samples[0].problem.prompt
    assert samples[0].problem.meta == {"subject": "Prealgebra", "level": 1}
    checks = env.check_batch(samples, ["\\boxed{0.5}", "x=\\boxed{4}", "\\boxed{(x+1)^2}", "\\boxed{\\sqrt{50}}",
                                       "\\boxed{(1,3]}", "\\boxed{(3, \\pi/2)}"])
    assert [c.correct for c in checks] == [True] * 6


def test_gsm8k_fixture_and_package_data():
    env = env_from_yaml("gsm8k", dataset=str(FIX / "gsm8k.jsonl"))
    s = env.eval_samples()
    assert [x.answer for x in s] == ["16", "2000", "1.5", "98"]
    assert env.check(s[1], "He has \\boxed{2,000} stamps").correct
    assert env.check(s[2], "#### 1.50").correct
    packaged = env_from_yaml("gsm8k").eval_samples()
    assert len(packaged) == 1319 and packaged[0].answer == "18"
    with pytest.raises(DatasetMissing, match="openai/gsm8k"):
        env_from_yaml("gsm8k").train_samples()  # the package has no train split: say where to get one
    with pytest.raises(DatasetMissing, match="only a test split"):
        env_from_yaml("math").train_samples()  # never train on MATH-500 by accident


def test_gpqa_gold_letter_follows_correct_choice():
    env = env_from_yaml("gpqa", dataset=str(FIX / "gpqa_diamond.csv"))
    correct = {"recFIX001": "Nitrogen", "recFIX002": "Weber", "recFIX003": "Chloroplast", "recFIX004": "6",
               "recFIX005": "sp3"}
    for s in env.eval_samples():
        choices = s.problem.meta["choices"]
        assert list(choices) == ["A", "B", "C", "D"]
        assert choices[s.answer] == correct[s.id]
        assert f"({s.answer}) {correct[s.id]}\n" in s.problem.prompt
        perm = env.record(s)["choice_permutation"]
        assert LETTER_OF(perm) == s.answer  # source index 0 (the correct answer) sits at the gold letter
        assert "permutation" not in s.problem.meta and "shuffle_seed" not in s.problem.meta
        assert set(s.problem.meta) == {"choices", "domain"}
        assert env.check(s, f"The answer is ({s.answer}).").correct


def LETTER_OF(perm):
    return "ABCD"[perm.index(0)]


def test_gpqa_shuffle_is_deterministic_and_seeded():
    a = [s.problem for s in env_from_yaml("gpqa", dataset=str(FIX / "gpqa_diamond.csv")).eval_samples()]
    b = [s.problem for s in env_from_yaml("gpqa", dataset=str(FIX / "gpqa_diamond.csv")).eval_samples()]
    assert a == b
    texts = ["w", "x", "y", "z"]
    assert text_order("recX", 0, texts) == text_order("recX", 0, texts)
    orders = {tuple(text_order("recX", seed, texts)) for seed in range(20)}
    assert len(orders) > 5  # the recorded seed matters
    assert len({tuple(text_order(q, 3, texts)) for q in ("recX", "recY", "recZ", "recW")}) > 1  # so does the id
    # the order follows the texts, not their source positions
    rev = texts[::-1]
    assert [texts[i] for i in text_order("recX", 0, texts)] == [rev[i] for i in text_order("recX", 0, rev)]
    seeded = [s.problem for s in env_from_yaml("gpqa", dataset=str(FIX / "gpqa_diamond.csv"),
                                                 options={"shuffle_seed": 7}).eval_samples()]
    assert seeded != a and {p.id for p in seeded} == {p.id for p in a}


def test_gpqa_packaged_diamond_is_shuffled():
    env = env_from_yaml("gpqa")
    samples = env.eval_samples()
    assert len(samples) == 198
    counts = Counter(s.answer for s in samples)
    assert set(counts) == set("ABCD") and max(counts.values()) < 80  # not "always A" as in the source file
    for s in samples[:20]:
        assert env.check(s, f"The answer is ({s.answer})").correct


def test_mmlu_pro_ten_letters():
    env = env_from_yaml("mmlu_pro", dataset=str(FIX / "mmlu_pro.jsonl"))
    s = {x.id: x for x in env.eval_samples()}
    assert s["9005"].answer == "J" and "(J) Newton's second law" in s["9005"].problem.prompt
    assert env.check(s["9005"], "the answer is (J)").correct
    assert s["9003"].answer == "B" and list(s["9003"].problem.meta["choices"]) == ["A", "B", "C", "D"]
    assert not env.check(s["9003"], "The answer is (E)").parseable  # only four options here
    shuffled = env_from_yaml("mmlu_pro", dataset=str(FIX / "mmlu_pro.jsonl"), options={"shuffle_seed": 5})
    for x in shuffled.eval_samples():
        assert x.problem.meta["choices"][x.answer] == s[x.id].problem.meta["choices"][s[x.id].answer]


def test_missing_hf_dataset_says_how_to_get_it(monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    env = env_from_yaml("math", dataset="rlexp-test/no-such-dataset")
    with pytest.raises(DatasetMissing) as e:
        env.eval_samples()
    msg = str(e.value)
    assert "huggingface-cli download rlexp-test/no-such-dataset --repo-type dataset --revision" in msg
    assert "HF_HUB_OFFLINE=1" in msg
    with pytest.raises(DatasetMissing, match="does not exist"):
        env_from_yaml("math", dataset="/nonexistent/math.jsonl").eval_samples()


# --- calculator ---------------------------------------------------------------------------------------
def test_safe_eval_is_arithmetic_only():
    assert safe_eval("12*7") == "84"
    assert safe_eval("(3+4)*2^3") == "56"
    assert safe_eval("7/2") == "3.5"
    assert safe_eval("1/0") == "error: division by zero"
    assert safe_eval("9**9**9").startswith("error")
    for evil in ("__import__('os').system('true')", "open('x')", "[1]*10**9", "a.b", "lambda: 1"):
        assert safe_eval(evil).startswith("error")


def test_calculator_step_and_check():
    env = env_from_yaml("calculator", dataset=str(FIX / "calculator.jsonl"))
    s = env.eval_samples()[1]
    assert s.answer == "10081" and "<calc>" in s.problem.prompt
    assert env.step(s, "", "First <calc>347*29</calc>") == "<result>10063</result>"
    assert env.step(s, "", "First <calc>347*29") == "</calc><result>10063</result>"  # stop string dropped
    transcript = "First <calc>347*29</calc><result>10063</result>"
    assert env.step(s, transcript, " so \\boxed{10081}") is None  # final answer ends the episode
    assert env.step(s, transcript, " I give up") is None  # no call, no answer: ends too
    full = transcript + " so \\boxed{10081}"
    assert env.check(s, full).correct
    assert not env.check(s, "<result>10081</result>").parseable  # tool output is never the answer
    many = "<calc>1</calc><result>1</result>" * 3
    assert env.step(s, many, "<calc>2</calc>") is None  # max_turns=4 reached


def test_calculator_generated_split_is_fixed_and_disjoint():
    env = env_from_yaml("calculator", eval_size=50, options={"n_train": 200, "max_operand": 99})
    held = {s.id for s in env.eval_samples()}
    train = {s.id for s in env.train_samples()}
    assert len(held) == 50 and len(train) == 200 and not held & train
    again = env_from_yaml("calculator", eval_size=50, options={"n_train": 200, "max_operand": 99})
    assert [s.id for s in again.eval_samples()] == [s.id for s in env.eval_samples()]
    s = env.eval_samples()[0]
    assert eval(s.id) == int(s.answer)  # the id is our own generated "a*b+c"


def test_env_config_rejects_unknown_keys():
    with pytest.raises(ConfigKeyError, match="datset"):
        env_config({"name": "math", "datset": "typo"})
    assert isinstance(env_config({"name": "math"}), EnvConfig)


def test_arithmetic_held_out_min_drops_thin_classes_and_moves_no_other_prompt():
    """issue 46 item 3: sums 1 and 8 hold out 2 prompts each; held_out_min=8 evaluates sums 2-7
    only, and (with train_sums=held_out) trains on them only; the verifier split stays the same."""
    base = {"verifier_frac": 0.25, "train_sums": "held_out"}
    old = build_env(EnvConfig(name="arithmetic", options=base))
    new = build_env(EnvConfig(name="arithmetic", options={**base, "held_out_min": 8}))
    (old_train, old_held), (new_train, new_held) = old._split(), new._split()
    assert Counter(sum(t) for t in old_held)[1] == 2
    assert Counter(sum(t) for t in new_held) == {2: 9, 3: 21, 4: 31, 5: 31, 6: 21, 7: 9}
    assert set(new_held) == {t for t in old_held if 2 <= sum(t) <= 7}
    assert new_train == {s: v for s, v in old_train.items() if 2 <= s <= 7}
    assert new.verifier_sequences(0.25) == old.verifier_sequences(0.25)
    assert {s.answer for s in new.eval_samples()} == set("234567")
    with pytest.raises(ValueError, match="held_out_min=32: no answer class"):
        build_env(EnvConfig(name="arithmetic", options={"held_out_min": 32}))._split()
    with pytest.raises(ValueError, match="held_out_min must be >= 0"):
        build_env(EnvConfig(name="arithmetic", options={"held_out_min": -1}))._split()
