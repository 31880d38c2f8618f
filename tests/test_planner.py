"""Memory planner: 8B and 32B estimates against hand-computed numbers, refusals and their advice."""
from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from rlexp.cluster import plan_cli
from rlexp.cluster.memory import ADAMW_TEMP_STATES, LOGIT_PEAK_BYTES, GiB
from rlexp.cluster.planner import PlanError, check_plan, plan_memory
from rlexp.config.model import ModelConfig
from rlexp.config.reward import RewardConfig, VerifierConfig, VerifierSetConfig
from rlexp.config.schema import Backend
from rlexp.config.typed import typed_config
from rlexp.models.policy import token_logprobs

CONF = Path(__file__).resolve().parents[1] / "conf"
# Reference RL workload the default layouts are sized for (documented in the report):
# 32 prompts x 8 samples, 1024 prompt + 3072 response tokens, micro-batch 1, activation checkpointing, 80 GB GPUs.
WORKLOAD = {"max_prompt_tokens": 1024, "max_tokens": 3072, "group_size": 8, "prompts_per_step": 32, "kl_coef": 0.0}
FSDP4 = {"trainer_fsdp": 4, "generator_replicas": 4}  # the 8B layout these tests were worked out by hand for
HOSTS = {"qwen3_0_6b": 1, "qwen3_1_7b": 1, "qwen3_4b": 1, "qwen3_8b": 1, "qwen3_14b": 2, "qwen3_32b": 3}


def run_cfg(model: str, *, hosts: int = 1, gpu_gb: float = 80, ac: bool = True, mb: int = 1, prompts: int = 32,
            **model_par):
    raw = OmegaConf.load(CONF / "model" / f"{model}.yaml")
    raw.pop("defaults", None)  # the run a real model brings (conf/scale/): composed by Hydra, not here
    m = OmegaConf.merge(OmegaConf.structured(ModelConfig), raw)
    for k, v in model_par.items():
        m.parallelism[k] = v
    return typed_config(OmegaConf.create({  # the rest of the run: the schema's defaults
        "model": m,
        "cluster": {"gpu_memory_gb": gpu_gb, "gpus_per_host": 8, "hosts": hosts},
        "trainer": {"micro_batch_size": mb, "activation_checkpointing": ac, "mixed_precision": True},
        "algorithm": {**WORKLOAD, "prompts_per_step": prompts},
    }))


# The trainer's peak is what it holds throughout plus the largest of its phases, which never overlap
# (rlexp/cluster/planner.py): forward/backward, the optimizer step, the weight push. With mixed
# precision it holds 16 B per parameter, sharded: fp32 master 4 + fp32 gradient 4 + AdamW m and v 4
# + 4. The logits' peak is 12.5 B per element (measured below, test_logits_peak_is_measured),
# AdamW's foreach temporaries one fp32 copy of the second moment (4 B per parameter,
# test_adamw_temporaries_are_measured), the streamed weight push the largest single tensor in fp32.
RUNTIME = 2 * GiB


def test_qwen3_0_6b_by_hand():
    # FSDP 2 trainer, three 1-GPU generators (the model's layout)
    r = check_plan(run_cfg("qwen3_0_6b"))
    n = 596_049_920  # see test_models_catalog.EXACT
    t = r.trainer
    assert t.get("parameters (fp32 master)") == n * 4 / 2 == 1_192_099_840
    assert t.get("gradients (fp32)") == n * 4 / 2
    assert t.get("AdamW m+v (fp32)") == n * 8 / 2 == 2_384_199_680
    held = n * 16 / 2 + RUNTIME  # 4,768,399,360 + 2 GiB
    assert t.phase_bytes("") == held == 6_915_883_008
    # largest FSDP unit: the tied 151936 x 1024 embedding (155,582,464 > one block's 15,730,944:
    # attention 1024*2048 + 2*1024*1024 + 2048*1024 + 2*128, MLP 3*1024*3072, norms 2*1024)
    assert t.get("FSDP all-gather buffers") == 2 * 155_582_464 * (2 + 4) == 1_866_989_568
    # checkpointed: 28 block inputs of 1024 + one block's 4*1024 + 3*2048 + 3*1024 + 4*3072 = 25,600
    # per token
    assert t.get("activations") == (28 * 1024 + 25_600) * 4096 * 2 == 444_596_224
    assert t.get("logits + logprob grads") == 4096 * 151936 * 12.5 == 7_779_123_200
    fwd_bwd = 1_866_989_568 + 444_596_224 + 7_779_123_200
    assert t.phase_bytes("forward/backward") == fwd_bwd == 10_090_708_992
    assert t.get("AdamW foreach temporaries") == n * 4 / 2 == 1_192_099_840  # [optimizer step]
    assert t.get("weight push (streamed)") == 151936 * 1024 * 4 == 622_329_856  # [weight push]
    assert t.peak_phase == "forward/backward"
    assert t.total_bytes == held + fwd_bwd == 17_006_592_000  # 15.8 GiB of 72 usable
    g = r.generator  # 32 x 8 = 256 sequences over 3 replicas: ceil(85.3) = 86 each, 4096 tokens
    assert g.get("weights (bfloat16)") == n * 2
    assert g.get("KV cache") == 2 * 28 * 8 * 128 * 2 * 86 * 4096 == 40_399_536_128
    assert g.get("sampler logits (fp32)") == 86 * 151936 * 4
    assert g.total_bytes == n * 2 + 40_399_536_128 + 86 * 151936 * 4 + RUNTIME == 43_791_385_600
    # vLLM gets the generator's peak over the GPU's 80 GiB, rounded up to a hundredth: 0.5098 ->
    # 0.51
    assert r.gpu_memory_utilization == 0.51
    assert 43_791_385_600 / (80 * GiB) == pytest.approx(0.5098, abs=1e-4)
    assert r.ok


def test_qwen3_8b_by_hand():
    r = check_plan(run_cfg("qwen3_8b", **FSDP4))  # 4 x TP 1 generators
    n = 8_190_735_360  # see test_models_catalog.EXACT
    t = r.trainer
    assert t.get("parameters (fp32 master)") == n * 4 / 4 == 8_190_735_360
    assert t.get("gradients (fp32)") == n * 4 / 4
    assert t.get("AdamW m+v (fp32)") == n * 8 / 4 == 16_381_470_720
    held = n * 16 / 4 + RUNTIME
    assert t.phase_bytes("") == held == 34_910_425_088
    # largest FSDP unit: the untied 151936 x 4096 embedding (622,329,856 > one block's 192,946,432),
    # two of them unsharded at once, bf16 params + fp32 grads
    assert t.get("FSDP all-gather buffers") == 2 * 622_329_856 * (2 + 4) == 7_467_958_272
    # checkpointed: 36 block inputs of 4096 + one block's saved tensors per token:
    # 4*4096 + 3*(32*128) + 3*(8*128) + 4*12288 = 16384 + 12288 + 3072 + 49152 = 80,896
    assert t.get("activations") == (36 * 4096 + 80_896) * 4096 * 2 == 1_870_659_584
    assert t.get("logits + logprob grads") == 4096 * 151936 * 12.5 == 7_779_123_200
    fwd_bwd = 7_467_958_272 + 1_870_659_584 + 7_779_123_200
    assert t.phase_bytes("forward/backward") == fwd_bwd == 17_117_741_056
    # less than forward/backward
    assert t.get("AdamW foreach temporaries") == n * 4 / 4 == 8_190_735_360
    # the streamed push holds one unsharded tensor, the 151936 x 4096 embedding in fp32: 2.3 GiB,
    # not the whole model (15 GiB in bf16 on every trainer GPU before the push was streamed)
    assert t.get("weight push (streamed)") == 622_329_856 * 4 == 2_489_319_424
    assert t.total_bytes == held + fwd_bwd == 52_028_166_144  # 48.5 GiB of 72 usable
    g = r.generator  # 32 x 8 = 256 sequences over 4 replicas = 64 each, 4096 tokens
    assert g.get("weights (bfloat16)") == n * 2 == 16_381_470_720
    assert g.get("KV cache") == 2 * 36 * 8 * 128 * 2 * 64 * 4096 == 38_654_705_664  # 36 GiB
    assert g.get("sampler logits (fp32)") == 64 * 151936 * 4
    assert g.total_bytes == 57_222_555_648  # 53.3 GiB
    assert r.gpu_memory_utilization == 0.67  # 53.29 / 80 = 0.6661, rounded up
    assert r.ok and r.gpus_needed == 8


def test_qwen3_32b_by_hand():
    r = check_plan(run_cfg("qwen3_32b", hosts=3))  # FSDP 8 x TP 2 trainer, 2 x TP 4 generators
    n = 32_762_123_264
    t = r.trainer
    assert t.get("parameters (fp32 master)") == n * 4 / 16 == 8_190_530_816
    assert t.get("AdamW m+v (fp32)") == n * 8 / 16 == 16_381_061_632
    held = n * 16 / 16 + RUNTIME
    assert t.phase_bytes("") == held == 34_909_606_912
    assert t.get("FSDP all-gather buffers") == 2 * 151936 * 5120 * 6 / 2 == 4_667_473_920
    # per token per block: 4*5120 + 3*8192 + 3*1024 + 4*25600 = 150,528, of which TP 2 (no sequence
    # parallelism) halves all but the 4*5120 norm terms; the 64 checkpointed block inputs stay whole
    assert t.get("activations") == (64 * 5120 + 4 * 5120 + (150_528 - 4 * 5120) / 2) * 4096 * 2 == 3_384_803_328
    assert t.get("logits + logprob grads") == 4096 * 151936 * 12.5 / 2 == 3_889_561_600
    fwd_bwd = 4_667_473_920 + 3_384_803_328 + 3_889_561_600
    assert t.phase_bytes("forward/backward") == fwd_bwd == 11_941_838_848
    assert t.get("AdamW foreach temporaries") == n * 4 / 16 == 8_190_530_816
    # one 151936 x 5120 fp32 tensor gathered whole: 2.9 GiB, where gathering every tensor first took
    # 61 GiB
    assert t.get("weight push (streamed)") == 151936 * 5120 * 4 == 3_111_649_280
    assert t.total_bytes == held + fwd_bwd == 46_851_445_760  # 43.6 GiB
    g = r.generator  # 256 sequences / 2 replicas = 128 each; 8 KV heads / TP 4 = 2 per GPU
    assert g.get("weights (bfloat16)") == n * 2 / 4
    assert g.get("KV cache") == 2 * 64 * 2 * 128 * 2 * 128 * 4096 == 32 * GiB
    assert g.total_bytes / GiB == pytest.approx(49.274, abs=1e-3)
    assert r.gpus_needed == 24 and r.ok


@pytest.mark.parametrize("model", list(HOSTS))
@pytest.mark.parametrize("variant", ["", "_instruct"])
def test_default_layouts_fit_the_reference_workload(model, variant):
    check_plan(run_cfg(model + variant, hosts=HOSTS[model], prompts=16))  # conf/scale/one_node.yaml's batch


def test_32b_on_one_node_is_refused_with_advice():
    cfg = run_cfg("qwen3_32b", hosts=1, trainer_fsdp=4, trainer_tp=1, generator_tp=4, generator_replicas=1)
    with pytest.raises(PlanError) as e:
        check_plan(cfg)
    msg = str(e.value)
    assert "trainer needs" in msg and "DOES NOT FIT" in msg
    assert "raise model.parallelism.trainer_fsdp to" in msg
    assert e.value.report.trainer.total_bytes > 100 * GiB  # 16 B x 32.8B / 4 alone is 122 GiB


def test_activation_checkpointing_and_micro_batch_advice():
    cfg = run_cfg("qwen3_8b", **FSDP4, ac=False, mb=2)
    r = plan_memory(cfg)
    assert not r.ok
    fixes = "\n".join(r.fixes)
    assert "trainer.activation_checkpointing=true" in fixes
    assert "shrink trainer.micro_batch_size to 1" in fixes


def test_generator_kv_refusal_and_gpu_count():
    cfg = run_cfg("qwen3_8b", trainer_fsdp=4, generator_replicas=1)
    cfg.algorithm.prompts_per_step = 64  # 512 sequences x 4096 tokens on one GPU = 288 GiB of KV
    r = plan_memory(cfg)
    fixes = "\n".join(r.fixes)
    assert "each generator GPU needs" in r.problems[0]
    assert "shrink the step batch" in fixes and "generator_replicas" in fixes
    cfg = run_cfg("qwen3_14b", hosts=1)
    r = plan_memory(cfg)
    assert any("needs 16 GPUs" in p for p in r.problems)


def test_tp_must_divide_heads():
    r = plan_memory(run_cfg("qwen3_14b", hosts=2, trainer_tp=3, trainer_fsdp=2))
    assert any("trainer_tp=3 does not divide" in p for p in r.problems)


def test_no_gpu_limit_only_reports():
    cfg = run_cfg("qwen3_8b", **FSDP4)
    cfg.cluster.gpu_memory_gb = 0.0  # the schema's "not configured"
    r = check_plan(cfg)
    assert r.ok and "no GPU memory limit" in r.table()


def _mini_conf(tmp_path: Path) -> Path:
    """A minimal run config composed by Hydra (the real model group, a fixed 80 GB cluster), independent of
    the defaults in conf/train.yaml."""
    (tmp_path / "model").mkdir()
    for f in (CONF / "model").glob("*.yaml"):  # without the run a real model brings (conf/scale/)
        raw = OmegaConf.load(f)
        raw.pop("defaults", None)
        OmegaConf.save(raw, tmp_path / "model" / f.name)
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "h100.yaml").write_text("device: cuda\ngpu_memory_gb: 80\ngpus_per_host: 8\nhosts: 1\n")
    (tmp_path / "train.yaml").write_text(
        "defaults:\n  - model: qwen3_8b\n  - cluster: h100\n  - _self_\n"
        "model: {parallelism: {trainer_fsdp: 4, generator_replicas: 4}}\n"
        "trainer: {micro_batch_size: 1, activation_checkpointing: true, mixed_precision: true}\n"
        "algorithm: {max_prompt_tokens: 1024, max_tokens: 3072, group_size: 8, prompts_per_step: 32}\n")
    return tmp_path


def test_plan_cli_composes_and_refuses(tmp_path, capsys):
    d = _mini_conf(tmp_path)
    assert plan_cli.main(["--config-dir", str(d), "model=qwen3_8b"]) == 0
    out = capsys.readouterr().out
    assert "trainer: 4 GPU(s), FSDP 4 x TP 1" in out and "fits" in out
    assert plan_cli.main(["--config-dir", str(d), "model=qwen3_32b"]) == 1
    captured = capsys.readouterr()
    assert "fix:" in captured.out and "refused" in captured.err
    assert plan_cli.main(["--config-dir", str(d), "model=qwen3_9b"]) == 2


def test_plan_cli_on_the_real_run_config(capsys):
    assert plan_cli.main(["model=qwen3_8b", "cluster=gpu_node", "trainer=large"]) == 0
    assert "FSDP 3 x TP 1" in capsys.readouterr().out
    assert plan_cli.main(["model=qwen3_32b", "cluster=gpu_node", "trainer=large"]) == 1
    assert "needs 24 GPUs" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------
# Served model verifiers: one GPU per replica, each sized by its verifier_set entry's memory_gb
# ----------------------------------------------------------------------------------------------------

RM = {"name": "rm", "kind": "reward_model", "options": {"hf_repo": "org/rm", "revision": "a" * 40},
      "replicas": 2, "memory_gb": 24}
JUDGE = {"name": "judge", "kind": "lm_judge", "options": {"path": "/models/judge"}, "memory_gb": 90}
POLICY_JUDGE = {"name": "policy_judge", "kind": "lm_judge", "options": {"policy": True}}  # the generators serve it
MAJORITY = {"name": "majority", "kind": "majority"}


def with_verifiers(cfg, *members, reward: str = "weaver", **options):
    cfg.reward = RewardConfig(name=reward, options=options)
    cfg.verifier_set = VerifierSetConfig(name="test", members=[VerifierConfig(**m) for m in members])
    return cfg


def test_verifiers_are_counted_sized_and_printed():
    r = plan_memory(with_verifiers(run_cfg("qwen3_8b", **FSDP4, hosts=2), RM, JUDGE, POLICY_JUDGE, MAJORITY))
    assert [(v.name, v.kind, v.replicas) for v in r.verifiers] == [("rm", "reward_model", 2), ("judge", "lm_judge", 1)]
    assert r.gpus_needed == 4 + 4 + 2 + 1  # trainer + generators + one GPU per verifier replica
    assert r.verifiers[0].bytes_per_gpu == 24 * GiB and r.verifiers[0].fits
    assert not r.verifiers[1].fits  # 90 GiB on a GPU with 72 usable
    assert any("verifier 'judge'" in p and "90.0 GiB" in p for p in r.problems)
    table = r.table()
    assert "verifiers: 3 GPU(s), 2 served model verifier(s) of reward=weaver (verifier_set=test)" in table
    assert f"org/rm@{'a' * 40}" in table and "/models/judge" in table and "DOES NOT FIT" in table
    assert "policy_judge" not in table and "majority" not in table


def test_single_rm_serves_one_verifier_and_rule_none():
    cfg = with_verifiers(run_cfg("qwen3_8b", **FSDP4, hosts=2), JUDGE, RM, reward="single_rm")
    assert [v.name for v in plan_memory(cfg).verifiers] == ["rm"]  # the first reward model
    cfg = with_verifiers(run_cfg("qwen3_8b", **FSDP4, hosts=2), JUDGE, RM, reward="single_rm", verifier="judge")
    assert [v.name for v in plan_memory(cfg).verifiers] == ["judge"]
    r = plan_memory(with_verifiers(run_cfg("qwen3_8b", **FSDP4, hosts=2), JUDGE, RM, reward="rule"))
    assert r.verifiers == [] and r.gpus_needed == 8


def test_verifier_gpus_beyond_the_host_are_refused_with_advice():
    one = dict(RM, replicas=1)
    r = plan_memory(with_verifiers(run_cfg("qwen3_8b", **FSDP4), one))
    assert any("needs 9 GPUs (trainer 4x1 + generators 4x1 + verifiers 1)" in p for p in r.problems)
    # three replicas still hold the step's 256 sequences (86 each: 48.4 GiB of KV), and free one GPU
    assert "(verifiers) lower model.parallelism.generator_replicas to 3" in "\n".join(r.fixes)
    r = plan_memory(with_verifiers(run_cfg("qwen3_8b", **FSDP4), dict(RM, replicas=3)))
    fixes = "\n".join(r.fixes)
    assert "generator_replicas to" not in fixes.split("(verifiers)", 1)[1]  # two replicas' KV would not fit
    assert "at most 1 fit beside the trainer (4) and 3 generator replica(s)" in fixes


class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storage alive, and their peak, over the ops run inside: each op's output
    storages are counted when made and uncounted when freed (a finalizer on the storage). How the
    planner's per-element constants were measured, on CPU: the same ops allocate the same tensors on
    CUDA."""

    def __init__(self) -> None:
        super().__init__()
        self.live, self.peak, self.seen = 0, 0, set()

    def _free(self, key: int, n: int) -> None:
        self.live -= n
        self.seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if st.data_ptr() in self.seen or not st.nbytes():
                    continue
                self.seen.add(st.data_ptr())
                self.live += st.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(st, self._free, st.data_ptr(), st.nbytes())
        return out


@pytest.mark.parametrize("dtype, measured", [(torch.bfloat16, 12.25), (torch.float32, 12.5)])
def test_logits_peak_is_measured(dtype, measured):
    """The trainer's logprobs (`sequence_logprobs`: logits cast to fp32, over the temperature,
    log-softmax, gather) through their backward peak at 12.25 B per logit element for bf16 logits
    and 12.5 for fp32: the planner counts the larger, LOGIT_PEAK_BYTES (the old 10 B
    undercounted)."""
    T, V = 256, 2048
    h = torch.randn(T, 32, dtype=dtype, requires_grad=True)
    w = torch.randn(V, 32, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, V, (1, T))
    with LiveBytes() as m:
        # [1, T, V] in the compute dtype, as the model's head returns it
        logits = (h @ w.t()).unsqueeze(0)
        logp = token_logprobs(logits.float() / 0.7, targets)
        del logits
        logp.sum().backward()
    per_elem = m.peak / (T * V)
    assert per_elem == pytest.approx(measured, abs=0.05)
    assert measured <= LOGIT_PEAK_BYTES < measured + 0.5


def test_adamw_temporaries_are_measured():
    """`torch.optim.AdamW(foreach=True)` (CUDA's default) makes one fp32 copy of the second moment
    in `step` (`_foreach_sqrt`): ADAMW_TEMP_STATES x 4 B per parameter beyond the parameters,
    gradients and moments."""
    params = [torch.nn.Parameter(torch.randn(300, 300)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=True)
    opt.step()  # the moments exist from here on
    with LiveBytes() as m:
        opt.step()
    assert m.peak / sum(p.numel() for p in params) == pytest.approx(ADAMW_TEMP_STATES * 4, abs=0.01)


def test_vllm_generator_counts_its_profile_run_by_hand():
    """generator=vllm keeps, beside weights and KV cache, the peak of its profile run; the derived
    gpu_memory_utilization includes it, so vLLM's KV cache is the one the plan counted."""
    cfg = run_cfg("qwen3_8b", **FSDP4)
    cfg.generator.backend = Backend.vllm
    cfg.generator.max_num_batched_tokens, cfg.generator.max_num_seqs = 65536, 1024
    r = check_plan(cfg)
    g = r.generator
    # per token: residual + norm output 2 x 4096, q 4096 + attention out 4096, k and v 2 x 1024,
    # SwiGLU w1, w3 and product 3 x 12288 (TP 1), in bf16
    per_token = 2 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 12288
    assert g.get("vLLM profile activations") == 65536 * per_token * 2
    assert g.get("vLLM profile activations") == 7_247_757_312
    assert g.get("vLLM profile sampler") == 1024 * 151936 * 8 == 1_244_659_712
    # the titan generator's 57,222,555,648 (test_qwen3_8b_by_hand) plus the two
    assert g.total_bytes == 57_222_555_648 + 7_247_757_312 + 1_244_659_712 == 65_714_972_672
    assert r.gpu_memory_utilization == 0.77  # 65,714,972,672 / 80 GiB = 0.765, rounded up
