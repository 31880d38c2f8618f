"""The warm-up (rlexp/run/warmup.py, issue 23 item 3): a shared start above chance, trained only on the policy's
training split, content-addressed and recorded; the random-init default of `rlexp train` is untouched."""
from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlexp.config.schema import register_configs
from rlexp.config.validate import ConfigError, validate
from rlexp.envs.registry import build_env
from rlexp.models.tokenizer import load_tokenizer
from rlexp.run import warmup
from rlexp.run.prepare import check_config, resolve_model
from tests.conftest import REPO

CONF = REPO / "conf"
register_configs()


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides))


class Recording:
    """The real environment, with a note of every problem the warm-up draws."""

    def __init__(self, env) -> None:
        self.env, self.drawn = env, set()

    def sample_batch(self, n, rng):
        out = self.env.sample_batch(n, rng)
        self.drawn.update(s.problem.prompt for s in out)
        return out

    def __getattr__(self, name):
        return getattr(self.env, name)


@torch.no_grad()
def balanced_greedy(path: Path, env) -> tuple[float, float]:
    """(balanced held-out accuracy, share of the commonest answer) of the greedy policy in `path`."""
    from transformers import Qwen3ForCausalLM

    tok = load_tokenizer(path)
    m = Qwen3ForCausalLM.from_pretrained(str(path)).eval()
    right, answers = collections.defaultdict(list), collections.Counter()
    for s in env.eval_samples():
        a = tok.decode([int(m(torch.tensor([tok.encode(s.problem.prompt)])).logits[0, -1].argmax())])
        right[s.answer].append(a == s.answer)
        answers[a] += 1
    common = answers.most_common(1)[0][1] / sum(answers.values())
    return sum(sum(v) / len(v) for v in right.values()) / len(right), common


def test_the_replication_start_is_above_chance_from_training_problems_only(tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "DEFAULT_CACHE", tmp_path)
    t = check_config(composed("experiment=weaver_cpu", "reward=annotated"))
    assert t.model.warmup.steps == 50 and t.model.init_seed == 1234  # one shared start, not one per seed
    env = build_env(t.environment)
    rec = Recording(env)
    base = resolve_model(t.model)
    path, record = warmup.ensure_warm_checkpoint(base, t, rec)
    held = {s.problem.prompt for s in env.eval_samples()}
    from rlexp.rewards.verifiers.tiny_data import verifier_split_sequences

    verifier = {"+".join(map(str, q)) + "=" for q in verifier_split_sequences(frac=0.25)}
    assert rec.drawn and not rec.drawn & held and not rec.drawn & verifier
    assert {sum(map(int, p[:-1].split("+"))) for p in rec.drawn} == set(range(1, 9))  # train_sums=held_out
    acc, common = balanced_greedy(path, env)
    assert 0.4 < acc < 0.95 and common < 0.5  # above chance (0.125), not solved, not one answer
    assert record["steps"] == 50 and record["last_loss"] < record["first_loss"]
    assert json.loads((path / warmup.RECORD).read_text()) == record
    assert (path / "config.json").read_bytes() == (base / "config.json").read_bytes()  # same architecture

    again, _ = warmup.ensure_warm_checkpoint(base, t, env)  # reused, not retrained
    assert again == path and (path / "model.safetensors").stat().st_mtime_ns == \
        (again / "model.safetensors").stat().st_mtime_ns
    t.model.warmup.steps = 5
    other, _ = warmup.ensure_warm_checkpoint(base, t, env)
    assert other != path  # another recipe, another folder


def test_the_default_run_starts_from_random_weights():
    t = check_config(composed())
    assert t.model.warmup.steps == 0


@pytest.mark.parametrize("overrides,match", [
    (["model.warmup.steps=-1"], "model.warmup.steps"),
    (["model.warmup.steps=5", "model.warmup.lr=0"], "model.warmup.lr"),
    (["model=qwen3_8b", "model.warmup.steps=5"], "warm-up is for the embedded tiny model"),
])
def test_bad_warmups_are_refused_before_anything_runs(overrides, match):
    with pytest.raises(ConfigError, match=match):
        validate(OmegaConf.to_object(composed(*overrides)))


def test_a_killed_writer_leaves_no_folder_that_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(warmup, "DEFAULT_CACHE", tmp_path)
    t = check_config(composed("experiment=weaver_cpu", "reward=annotated", "model.warmup.steps=2"))
    env = build_env(t.environment)

    class Boom(RuntimeError):
        pass

    def fail(*a, **k):
        raise Boom

    monkeypatch.setattr(warmup, "_greedy_accuracy", fail)
    with pytest.raises(Boom):
        warmup.ensure_warm_checkpoint(resolve_model(t.model), t, env)
    assert not any((tmp_path / "warm").iterdir())  # the temporary folder went with the error
    monkeypatch.undo()
    monkeypatch.setattr(warmup, "DEFAULT_CACHE", tmp_path)
    path, _ = warmup.ensure_warm_checkpoint(resolve_model(t.model), t, env)
    assert (path / warmup.RECORD).exists()


class NewAnswers:
    """The same environment, name and options, every training answer changed (a user's fix)."""

    def __init__(self, env) -> None:
        self.env = env

    def train_samples(self):
        return [dataclasses.replace(s, answer=s.answer + "0") for s in self.env.train_samples()]

    def __getattr__(self, name):
        return getattr(self.env, name)


def test_the_key_follows_the_data_code_and_recipe_and_a_hit_is_announced(tmp_path, monkeypatch,
                                                                         capsys):
    """Issue 45: a warm-up trained on old answers was reused after the task's answers changed."""
    monkeypatch.setattr(warmup, "DEFAULT_CACHE", tmp_path)
    t = check_config(composed("experiment=weaver_cpu", "reward=annotated"))
    env, base = build_env(t.environment), resolve_model(t.model)
    spec = warmup.warm_spec(base, t, env)
    key = warmup.warm_key(spec)
    assert warmup.warm_key(warmup.warm_spec(base, t, env)) == key  # a pure function of its inputs
    assert warmup.warm_key(warmup.warm_spec(base, t, NewAnswers(env))) != key
    assert warmup.warm_key({**spec, "code": {**spec["code"], "warmup_code": "edited"}}) != key
    assert spec["code"]["warmup_code"] == warmup.sha256_file(Path(warmup.__file__))[:16]
    t.model.warmup.lr *= 2
    assert warmup.warm_key(warmup.warm_spec(base, t, env)) != key
    t.model.warmup.lr /= 2
    folder = tmp_path / "warm" / key
    folder.mkdir(parents=True)
    (folder / warmup.RECORD).write_text(json.dumps({"key": key}))
    path, record = warmup.ensure_warm_checkpoint(base, t, env)  # a hit: nothing trained
    assert path == folder and record == {"key": key}
    assert f"model.warmup: cache hit, key {key}" in capsys.readouterr().err
