"""The evaluation runner and result writing, driven by a scripted fake generator (no model can run in a
unit test of the scoring path; the real tiny-model path is in test_eval_cli.py)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from omegaconf import OmegaConf

from rlexp.config.eval import EvalConfig
from rlexp.envs.registry import build_env
from rlexp.evals.benchmarks import env_config
from rlexp.evals.results import write_samples, write_tables
from rlexp.evals.runner import apply_stop, evaluate, run_benchmark
from rlexp.types import Completion

FIX = Path(__file__).parent / "fixtures"
CONF = Path(__file__).resolve().parents[1] / "conf" / "environment"


class CharTok:
    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


TOK = CharTok()


def fake_generator(script):
    """generate_fn whose response to each prompt is script(prompt_text, sample_index); records its calls."""
    calls = []

    def generate_fn(prompt_ids, n, max_tokens, temperature, seed):
        calls.append((len(prompt_ids), n, seed))
        out = []
        for ids in prompt_ids:
            text = TOK.decode(ids)
            for j in range(n):
                resp = script(text, j)
                out.append(Completion(prompt_ids=ids, token_ids=TOK.encode(resp), logprobs=[0.0] * len(resp),
                                      text=resp, policy_version=0))
        return out

    generate_fn.calls = calls
    return generate_fn


def env(name, **over):
    node = OmegaConf.load(CONF / f"{name}.yaml")
    node = node.environment if "environment" in node else node  # global-package options (calculator, guess)
    return build_env(env_config(OmegaConf.merge(node, over)))


def test_evaluate_metric_names_for_training_env_and_benchmark():
    e = env("gsm8k", dataset=str(FIX / "gsm8k.jsonl"))
    answers = {"baker": "\\boxed{16}", "stamps": "#### 2,000", "pencil": "I think 2", "pages": "\\boxed{97}"}
    gen = fake_generator(lambda p, j: next(v for k, v in answers.items() if k in p))
    m = evaluate(e, gen, TOK, EvalConfig(max_tokens=16), step=10)
    assert m["eval/accuracy"] == 0.5 and m["eval/unparseable"] == 0.25
    assert set(m) == {"eval/accuracy", "eval/partial_credit", "eval/unparseable", "eval/ci_low",
                      "eval/ci_high"}
    # gsm8k gives no Check.score: 1.0 right, 0.0 wrong
    assert m["eval/partial_credit"] == m["eval/accuracy"]
    m2 = evaluate(e, gen, TOK, EvalConfig(max_tokens=16), step=20, benchmark="gsm8k")
    assert m2["eval/gsm8k/accuracy"] == 0.5
    assert gen.calls[0][2] == gen.calls[1][2]  # the same sampling seed at every evaluation


def test_k_samples_give_pass_and_maj(tmp_path):
    e = env("mmlu_pro", dataset=str(FIX / "mmlu_pro.jsonl"))
    # sample 0 always right, samples 1 and 2 say (A)
    gold = {s.problem.prompt: s.answer for s in e.eval_samples()}
    gen = fake_generator(lambda p, j: f"The answer is ({gold[p] if j == 0 else 'A'})")
    m = evaluate(e, gen, TOK, EvalConfig(k=3, max_samples=4), step=0, benchmark="mmlu_pro", samples_dir=tmp_path)
    # question 9004's gold is A, so all three samples are right there
    assert m["eval/mmlu_pro/pass@3"] == 1.0
    assert m["eval/mmlu_pro/maj@3"] == 0.25
    assert abs(m["eval/mmlu_pro/accuracy"] - (3 + 3) / 12) < 1e-9
    lines = (tmp_path / "mmlu_pro_step000000.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])["sample_index"] == 0


def test_gpqa_records_and_tables(tmp_path):
    e = env("gpqa", dataset=str(FIX / "gpqa_diamond.csv"))
    gold = {s.problem.prompt: s.answer for s in e.eval_samples()}
    gen = fake_generator(lambda p, j: f"<think>The answer is (A)</think>The answer is ({gold[p]})")
    res = run_benchmark("gpqa_diamond", e, gen, TOK)
    assert res.metrics["accuracy"] == 1.0
    write_samples(tmp_path / "samples_gpqa_diamond.jsonl", res.records)
    rec = [json.loads(x) for x in (tmp_path / "samples_gpqa_diamond.jsonl").read_text().splitlines()]
    for r in rec:
        assert {"prompt_id", "prompt", "response", "extracted", "gold", "correct", "parseable",
                "choice_permutation"} <= set(r)
        assert "ABCD"[r["choice_permutation"].index(0)] == r["gold"] == r["extracted"]
    md, csv_path = write_tables(tmp_path, [res], "# test")
    row = next(csv.DictReader(csv_path.open()))
    assert row["benchmark"] == "gpqa_diamond" and row["accuracy"] == "1.0000" and row["n_problems"] == "5"
    assert "| gpqa_diamond | 5 | 5 | 1.0000 |" in md.read_text()


def test_calculator_multi_turn_episode():
    e = env("calculator", dataset=str(FIX / "calculator.jsonl"))

    def script(prompt, j):
        transcript = prompt.split("\\boxed{}.\n", 1)[1]
        if not transcript:  # first turn: call the tool, then keep talking past the stop string
            expr = prompt.split("Compute ")[1].split(".")[0]
            return f"Let me compute. <calc>{expr}</calc><result>999</result> junk"
        value = transcript.rsplit("<result>", 1)[1].split("</result>")[0]
        return f" so \\boxed{{{value}}}"

    res = run_benchmark("calculator", e, fake_generator(script), TOK, max_tokens=64)
    assert res.metrics["accuracy"] == 1.0
    r = res.records[1]
    assert r.turns == 2
    assert r.response == "Let me compute. <calc>347*29+18</calc><result>10081</result> so \\boxed{10081}"


def test_apply_stop_keeps_stop_string():
    assert apply_stop("a<calc>1</calc>b</calc>", ("</calc>",)) == "a<calc>1</calc>"
    assert apply_stop("plain", ("</calc>",)) == "plain"



def test_partial_credit_beside_exact_match(tmp_path):
    """A multi-token answer's partial credit (`Check.score`, sort: the fraction of positions right)
    is reported at evaluation beside exact match, and each response's score is in the samples
    file."""
    e = env("sort")
    samples = e.eval_samples()
    gold = {s.problem.prompt: s.answer for s in samples}
    first = samples[0].problem.prompt
    # the first problem exactly right; every other one with its last two of 8 positions wrong
    flip = {"0": "1", "1": "0"}
    def answer(p: str, j: int) -> str:
        return gold[p] if p == first else gold[p][:6] + "".join(flip[c] for c in gold[p][6:])

    gen = fake_generator(answer)
    m = evaluate(e, gen, TOK, EvalConfig(max_tokens=8), step=0, samples_dir=tmp_path)
    n = len(samples)
    assert m["eval/accuracy"] == 1 / n
    assert abs(m["eval/partial_credit"] - (1 + (n - 1) * 6 / 8) / n) < 1e-12
    rows = [json.loads(x) for x in (tmp_path / "train_step000000.jsonl").read_text().splitlines()]
    assert [r["score"] for r in rows] == [1.0] + [0.75] * (n - 1)
