"""single_rm with a real (tiny, randomly initialised) Hugging Face sequence classifier written to tmp_path."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.rewards.registry import build_reward
from rlexp.types import Problem, Sample

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def write_tiny_rm(path, num_labels: int = 1) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForSequenceClassification

    chars = "0123456789+=? abcdefghijklmnopqrstuvwxyz"
    vocab = {"<pad>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>").save_pretrained(path)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_labels=num_labels,
                      pad_token_id=0)
    Qwen3ForSequenceClassification(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a test must never reach the Hub


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return write_tiny_rm(tmp_path_factory.mktemp("tiny_rm"))


def batch():
    samples = [Sample(Problem(id="1+0+1", prompt="1+0+1="), answer="2")] * 4 + \
              [Sample(Problem(id="1+1", prompt="1+1="), answer="2")] * 4
    texts = ["2", "3", "a much longer response", "", "2", "22", "x", "two"]
    return samples, texts


def test_single_rm_scores_with_hf_sequence_classifier(rm_path):
    cfg = RewardConfig(name="single_rm", options={"kind": "reward_model", "path": rm_path, "batch_size": 3})
    reward = build_reward(cfg, env=None, served=False)
    samples, texts = batch()
    out = reward.score(samples, texts, group_size=4)
    rewards = np.array(out.rewards)
    assert rewards.shape == (8,) and np.isfinite(rewards).all() and ((rewards > 0) & (rewards < 1)).all()
    raw = np.array([d["raw"] for d in out.details])
    assert np.allclose(rewards, 1 / (1 + np.exp(-raw)))
    assert np.ptp(raw) > 0  # different inputs, different scores
    # Padding must not change a response's score: batched == one at a time (pooling the last real token).
    alone = [reward.verifier.score([s.problem], [t])[0] for s, t in zip(samples, texts)]
    assert np.allclose(raw, alone, atol=1e-5)
    json.dumps(out.details)
    assert {"reward/mean", "reward/std", "single_rm/raw_mean", "single_rm/flat_group_frac"} <= set(out.metrics)


def test_two_label_classifier_scores_log_odds_of_the_correct_label(tmp_path):
    path = write_tiny_rm(tmp_path / "rm2", num_labels=2)
    reward = build_reward(RewardConfig(name="single_rm", verifiers=[
        VerifierConfig(name="rm2", kind="reward_model", options={"path": path, "label": 1})]), env=None, served=False)
    samples, texts = batch()
    out = reward.score(samples, texts, group_size=4)
    model = reward.verifier.model
    enc = reward.verifier.tokenizer([s.problem.prompt + t for s, t in zip(samples, texts)], padding=True,
                                    return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    expected = (logits[:, 1] - logits[:, 0]).numpy()
    assert np.allclose([d["raw"] for d in out.details], expected, atol=1e-4)


def test_missing_checkpoint_names_the_path_and_the_fix(tmp_path):
    missing = tmp_path / "no_such_rm"
    with pytest.raises(FileNotFoundError) as e:
        build_reward(RewardConfig(name="single_rm", options={"kind": "reward_model", "path": str(missing)}), None,
                     served=False)
    msg = str(e.value)
    assert str(missing) in msg and "huggingface-cli download" in msg and "HF_HUB_OFFLINE" in msg
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        build_reward(RewardConfig(name="single_rm", options={"kind": "reward_model"}), None, served=False)
    with pytest.raises(ValueError, match="bad reward_model options"):
        build_reward(RewardConfig(name="single_rm", options={"kind": "reward_model", "path": str(tmp_path),
                                                            "temperature": 2}), None, served=False)


def test_weaver_combines_a_reward_model_with_rule_verifiers(rm_path):
    verifiers = [VerifierConfig(name="rm", kind="reward_model", options={"path": rm_path, "threshold": 0.5})] + [
        VerifierConfig(name=r, kind="rule", options={"rule": f"arithmetic_{r}"}) for r in ["parity", "mod5"]]
    reward = build_reward(RewardConfig(name="weaver", verifiers=verifiers, options={"min_active": 2}), env=None,
                          served=False)
    samples = [Sample(Problem(id=t, prompt=f"{t}="), answer=str(sum(map(int, t.split("+")))))
               for t in ["1+0+1+1+0+0+1+0+1", "0+0+0+0+0+0+0+0+1", "1+1+1+1+1+1+1+1+0", "0+1+0+1+0+1+0+1+0"]
               for _ in range(4)]
    texts = [str(d) for d in range(10)] + ["0", "3", "5", "7", "9", "1"]
    out = reward.score(samples, texts, group_size=4)
    scores = np.array([d["scores"]["rm"] for d in out.details])
    votes = np.array([d["votes"]["rm"] for d in out.details])
    # min-max over the window, then the threshold: votes are exactly the upper half of the score range.
    assert (votes == ((scores - scores.min()) / np.ptp(scores) >= 0.5)).all()
    assert np.isfinite(out.rewards).all()


def test_truncation_is_counted_and_reported(rm_path, caplog):
    reward = build_reward(RewardConfig(name="single_rm", options={"kind": "reward_model", "path": rm_path,
                                                                  "max_length": 6}), env=None, served=False)
    samples, texts = batch()
    with caplog.at_level("WARNING"):
        reward.score(samples, texts, group_size=4)
    assert reward.verifier.truncated > 0
    assert "were truncated" in caplog.text and "max_length=6" in caplog.text
