"""The checkpoint's own config.json against the run (rlexp/models/limits.py), before anything
spawns: real tiny HF-format checkpoints written to tmp (safetensors + config.json), whose
config.json each test then edits as a differing published checkpoint would read."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.cluster.plan_cli import compose_run_config
from rlexp.config.model import ArchConfig, ModelConfig
from rlexp.config.validate import ConfigError
from rlexp.models.catalog import QWEN3_SIZES, REVISIONS
from rlexp.models.limits import LimitError, apply_limits, cached_limits, read_limits
from rlexp.models.tiny import write_tiny_checkpoint
from rlexp.run.prepare import check_checkpoint_limits

ARCH = ArchConfig(max_seq_len=512)


def checkpoint(tmp_path: Path, **edits) -> Path:
    """A tiny Qwen3 checkpoint whose config.json has `edits` applied (None removes a key)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = write_tiny_checkpoint(ModelConfig(arch=ARCH), tmp_path / "ckpt")
    cfg = json.loads((out / "config.json").read_text())
    for k, v in edits.items():
        cfg.pop(k, None) if v is None else cfg.__setitem__(k, v)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_longer_context_is_capped_and_said(tmp_path):
    limits = read_limits(checkpoint(tmp_path))
    assert limits.max_positions == 512 and limits.vocab_size == ARCH.vocab_size
    assert limits.rope_scaling is None
    model = ModelConfig(name="m", arch=replace(ARCH, max_seq_len=2048))
    notes = apply_limits(model, limits, 64, 256)
    assert model.arch.max_seq_len == 512  # what vLLM gets as max_model_len
    assert len(notes) == 1 and "max_seq_len 2048 lowered to 512" in notes[0]
    assert "config.json" in notes[0]
    assert apply_limits(model, limits, 64, 256) == []  # within the limit: nothing to say


@pytest.mark.parametrize("edits, match", [
    ({"vocab_size": 999}, r"model.arch.vocab_size=128 but the checkpoint's vocab_size is 999"),
    ({"rope_theta": 10000.0}, r"model.arch.rope_theta=1e\+06 but the checkpoint's rope_theta is "
                              r"10000"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"RoPE scaling \{'rope_type': 'yarn'"),
    # transformers 5 writes RoPE settings into rope_parameters
    ({"rope_theta": None,
      "rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}},
     r"RoPE scaling \{'rope_type': 'yarn', 'factor': 4.0\}"),
])
def test_mismatch_is_refused_naming_both_values(tmp_path, edits, match):
    limits = read_limits(checkpoint(tmp_path, **edits))
    with pytest.raises(LimitError, match=match):
        apply_limits(ModelConfig(name="m", arch=ARCH), limits, 64, 256)


def test_run_longer_than_the_checkpoint_is_refused(tmp_path):
    limits = read_limits(checkpoint(tmp_path))
    with pytest.raises(LimitError, match=r"= 100 \+ 500 tokens .* 512 positions .* "
                                         r"algorithm.max_tokens=412"):
        apply_limits(ModelConfig(name="m", arch=ARCH), limits, 100, 500)


def test_prepare_caps_the_run_before_spawning(tmp_path):
    """`rlexp train` with model.path: the run's model.arch.max_seq_len (1024, the tiny default) is
    lowered to the checkpoint's 512 before any actor gets the config; a mismatch is a
    ConfigError."""
    ckpt = checkpoint(tmp_path)
    t = OmegaConf.to_object(compose_run_config([f"model.path={ckpt}"]))
    assert t.model.arch.max_seq_len == 1024
    assert check_checkpoint_limits(t, str(ckpt)) and t.model.arch.max_seq_len == 512
    bad = checkpoint(tmp_path / "b", vocab_size=4096)
    t = OmegaConf.to_object(compose_run_config([f"model.path={bad}"]))
    with pytest.raises(ConfigError, match="vocab_size is 4096"):
        check_checkpoint_limits(t, str(bad))
    # the tiny model, written from model.arch: nothing read
    t = OmegaConf.to_object(compose_run_config([]))
    assert check_checkpoint_limits(t, str(bad)) == []


def published_8b_config(cache: Path, max_positions: int) -> None:
    """Qwen/Qwen3-8B-Base's config.json, as the Hugging Face cache holds a downloaded snapshot (no
    weights)."""
    repo = "Qwen/Qwen3-8B-Base"
    snap = cache / f"models--{repo.replace('/', '--')}" / "snapshots" / REVISIONS[repo]
    snap.mkdir(parents=True)
    size = QWEN3_SIZES["8b"]
    (snap / "config.json").write_text(json.dumps({
        "hidden_size": size.dim, "num_hidden_layers": size.n_layers, "vocab_size": 151936,
        "max_position_embeddings": max_positions, "rope_theta": 1000000, "rope_scaling": None}))


def test_the_catalog_agrees_with_the_published_8b_config(tmp_path):
    """The 8B yaml's context is the published 32,768 (it said 40,960, which vLLM refuses at engine
    start): read from the cache, nothing to cap; an older 40,960 yaml would be capped and said."""
    published_8b_config(tmp_path, 32768)
    model: ModelConfig = OmegaConf.to_object(compose_run_config(["model=qwen3_8b"]).model)
    limits = cached_limits(model, cache_dir=tmp_path)
    assert limits is not None and limits.max_positions == 32768
    assert apply_limits(model, limits, 1024, 3072) == [] and model.arch.max_seq_len == 32768
    model.arch.max_seq_len = 40960
    assert "40960 lowered to 32768" in apply_limits(model, limits, 1024, 3072)[0]
    # not downloaded: checked at train time
    assert cached_limits(model, cache_dir=tmp_path / "empty") is None
