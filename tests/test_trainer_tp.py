"""The trainer with tensor parallelism (TorchTitan's Qwen3 TP plan) on CPU ranks (gloo), through real
Monarch actors.

A tiny Qwen3 with 4 query / 2 KV heads (TorchTitan shards attention by whole KV heads), untied. The
same batches go to a single-rank trainer, a TP-2 trainer and an FSDP-2 x TP-2 trainer (4 ranks):
  - weights after 3 steps agree with the single rank to 1e-5, and the per-step loss, grad norm and
    logprob diff agree (TP sums partial matmuls in another order, so not bitwise);
  - the logprobs are computed from vocabulary-sharded logits (loss-parallel cross-entropy): the test
    checks the logits really arrive sharded, so the no-gather path is the one being compared;
  - a TP checkpoint resumes TP bit for bit and a single rank to the same tolerance;
  - push_weights publishes the gathered weights in HF naming.
Plus `rlexp train model.parallelism.trainer_tp=2` end to end, and the refusal of a TP degree that does
not divide the KV heads.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlexp.actors.settings import TrainerSettings
from rlexp.actors.trainer import Reference, Trainer
from rlexp.config.model import ArchConfig, ModelConfig
from rlexp.config.schema import AlgorithmConfig, TrainConfig, TrainerConfig
from rlexp.config.validate import ConfigError, validate
from rlexp.models.parallel import PolicySettings, Ranks
from rlexp.models.tiny import ensure_tiny_checkpoint
from rlexp.transport import TransportSpec
from tests.conftest import metrics, rlexp, wait_no_orphans
from tests.trainer_helpers import free_port, grpo_batch, max_diff, rank0, train_steps

CFG = ModelConfig(arch=ArchConfig(n_heads=4, n_kv_heads=2, head_dim=32, tie_embeddings=False))
ALGO = AlgorithmConfig(max_tokens=4)
TP_VS_SINGLE_ATOL = 1e-5
TP_OVERRIDES = ("model.arch.n_heads=4", "model.arch.n_kv_heads=2", "model.arch.head_dim=32")












@pytest.fixture(scope="module")
def env(tmp_path_factory, two_procs):
    from monarch.actor import this_host

    d = str(ensure_tiny_checkpoint(CFG))
    batches = [grpo_batch(CFG, d, 0, 3), grpo_batch(CFG, d, 1, 2), grpo_batch(CFG, d, 2, 3)]
    # A process belongs to one process group, so TP-2 and FSDP-2 x TP-2 get their own meshes; the
    # single-rank trainers (no process group) share the first proc of the TP mesh. The TP mesh
    # is the session's two processes (tests/test_trainer_parallel.py's FSDP trainers use them).
    two = two_procs
    four = this_host().spawn_procs(per_host={"procs": 4})
    one = two.slice(procs=0)
    shm = tmp_path_factory.mktemp("shm")
    made: list = []

    def trainer(mesh, name: str, world: int, tp: int) -> tuple:
        policy = PolicySettings(CFG, d, 0, Ranks(world=world, tp=tp, threads=1, master_port=ports[world]))
        t = mesh.spawn(name, Trainer, TrainerSettings(policy, TrainerConfig(micro_batch_size=3), ALGO, 10, 0),
                       transports=[TransportSpec("shm", "rlexp.transport.shm", name, {"root": str(shm)})])
        made.append(t)
        return t, t.setup.call()

    ports = {1: 0, 2: free_port(), 4: free_port()}
    # Start all three before waiting for any: each pays its imports in parallel.
    started = {"single": trainer(one, "single", 1, 1), "tp": trainer(two, "tp", 2, 2),
               "fsdp_tp": trainer(four, "fsdp_tp", 4, 2)}
    for _, ready in started.values():
        ready.get()
    yield {"dir": d, "batches": batches, "two": two, "one": one, "tmp": shm, "trainer": trainer, "port": ports[2],
           **{k: t for k, (t, _) in started.items()}}
    for t in made:
        t.shutdown.call().get()
    four.stop().get()


@pytest.fixture(scope="module")
def runs(env):
    b = env["batches"]
    out = {"single_m": train_steps(env["single"], b), "tp_m": train_steps(env["tp"], b[:2])}
    out["ckpt"] = str(env["tmp"] / "tp_step2.pt")
    rank0(env["tp"], "save", out["ckpt"])
    out["tp_m"] += train_steps(env["tp"], b[2:])
    out["fsdp_tp_m"] = train_steps(env["fsdp_tp"], b)
    for name in ("single", "tp", "fsdp_tp"):
        out[name] = rank0(env[name], "full_hf_state_dict")
    out["published"] = rank0(env["tp"], "push_weights", 1)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tp", "fsdp_tp"])
def test_tensor_parallel_matches_single_rank(runs, layout: str) -> None:
    diff = max_diff(runs["single"], runs[layout])
    print(f"max |w_{layout} - w_single| after 3 steps: {diff:.3g}")
    assert diff < TP_VS_SINGLE_ATOL
    for a, b in zip(runs["single_m"], runs[f"{layout}_m"]):
        for k in ("loss", "train/grad_norm", "loss/clip_frac", "logprob_diff/mean", "logprob_diff/max"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
    assert runs["single_m"][-1]["loss"] != runs["single_m"][0]["loss"]  # it trained


@pytest.mark.slow
def test_tensor_parallel_logits_stay_vocab_sharded(env) -> None:
    """The compared path is the loss-parallel one: logits are a DTensor sharded over the vocabulary."""
    layout = rank0(env["tp"], "layout")
    assert layout["logits"] == ["S(2)"]  # Shard(2): [batch, seq, vocab / tp]
    params = layout["params"]
    # (fsdp, tp) placements: w1 column-wise and w2 row-wise over tp, and FSDP shards on top (a size-1
    # fsdp axis still shards, as in TorchTitan); norms are replicated over tp.
    assert params["layers.0.feed_forward.w1.weight"][1] == "S(0)"
    assert params["layers.0.feed_forward.w2.weight"][1] == "S(1)"
    assert params["layers.0.attention.qkv_linear.wqkv.weight"][1] == "S(0)"
    assert params["layers.0.ffn_norm.weight"][1] == "R"


@pytest.mark.slow
def test_tensor_parallel_checkpoint_and_publish(env, runs) -> None:
    from rlexp.models.hf import read_hf_state_dict

    pub = read_hf_state_dict(runs["published"]["shm"])
    assert all(torch.equal(pub[k], runs["tp"][k]) for k in runs["tp"])
    last = env["batches"][2:]
    again, ready = env["trainer"](env["two"], "tp_resumed", 2, 2)
    ready.get()
    assert rank0(again, "load", runs["ckpt"]) == 0
    untimed = lambda ms: [{k: v for k, v in m.items() if not k.startswith("time/")} for m in ms]  # noqa: E731
    assert untimed(train_steps(again, last)) == untimed(runs["tp_m"][2:])
    assert max_diff(rank0(again, "full_hf_state_dict"), runs["tp"]) == 0.0
    one, ready = env["trainer"](env["one"], "single_from_tp", 1, 1)
    ready.get()
    rank0(one, "load", runs["ckpt"])
    train_steps(one, last)
    assert max_diff(rank0(one, "full_hf_state_dict"), runs["single"]) < TP_VS_SINGLE_ATOL


@pytest.mark.slow
def test_reference_model_sharded_on_the_trainer_ranks_matches_one_rank(env) -> None:
    """The KL reference lives on the trainer's processes with the trainer's TP layout."""
    b = env["batches"][0]
    out = {}
    for name, mesh, world, tp in (("ref1", env["one"], 1, 1), ("ref_tp", env["two"], 2, 2)):
        ref = mesh.spawn(name, Reference, PolicySettings(CFG, env["dir"], 0, Ranks(world, tp, threads=1,
                                                                                master_port=env["port"])))
        ref.setup.call().get()
        out[name] = rank0(ref, "logprobs", b.prompts, b.responses, 1.0)
    assert [len(r) for r in out["ref_tp"]] == [len(r) for r in b.responses]
    diff = max(abs(x - y) for r1, r2 in zip(out["ref1"], out["ref_tp"]) for x, y in zip(r1, r2))
    assert diff < 1e-5, diff


@pytest.mark.slow
def test_a_bf16_model_under_tensor_parallelism_keeps_fp32_masters_and_moves_at_lr_1e_6(env) -> None:
    """TP 2 (DTensor parameters, FSDP2 at degree 1 on top): fp32 master shards cast to bf16 for the compute; one
    AdamW step at lr 1e-6 moves nearly every weight, and the published weights are bf16 (the serving dtype)."""
    cfg = replace(CFG, dtype="bfloat16")
    d = str(ensure_tiny_checkpoint(cfg))
    policy = PolicySettings(cfg, d, 0, Ranks(world=2, tp=2, threads=1, master_port=env["port"]))
    spec = TransportSpec("shm", "rlexp.transport.shm", "tp_bf16", {"root": str(env["tmp"])})
    t = env["two"].spawn("tp_bf16", Trainer, TrainerSettings(policy, TrainerConfig(lr=1e-6, micro_batch_size=3),
                                                               ALGO, 10, 0), transports=[spec])
    t.setup.call().get()
    try:
        before = rank0(t, "full_hf_state_dict")
        assert {v.dtype for v in before.values()} == {torch.float32}
        train_steps(t, [grpo_batch(cfg, d, 0, 3)])
        after = rank0(t, "full_hf_state_dict")
        moved = sum(int((after[k] != before[k]).sum()) for k in before)
        total = sum(v.numel() for v in before.values())
        assert moved > 0.9 * total, f"{moved:,} of {total:,} weights moved"
        from rlexp.models.hf import read_hf_state_dict

        pushed = read_hf_state_dict(rank0(t, "push_weights", 1)["shm"])
        assert pushed.keys() == after.keys() and {v.dtype for v in pushed.values()} == {torch.bfloat16}
        assert all(torch.equal(pushed[k], after[k].bfloat16()) for k in after)
    finally:
        t.shutdown.call().get()


def test_tp_degree_that_splits_a_kv_head_is_refused_with_the_fix() -> None:
    from omegaconf import OmegaConf

    c = OmegaConf.structured(TrainConfig)  # the default tiny model has a single KV head
    c.model.parallelism.trainer_tp = 2
    c = OmegaConf.to_object(c)  # resolves generator.replicas from the model's layout
    with pytest.raises(ConfigError, match=r"trainer_tp=2 must divide the model's n_kv_heads=1.*trainer_tp in \[1\]"
                                          r".*model.arch.n_kv_heads=2"):
        validate(c)


@pytest.mark.slow
def test_rlexp_train_with_tensor_parallel_trainer_end_to_end(tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    p = rlexp("train", "model.parallelism.trainer_tp=2", *TP_OVERRIDES, "steps=3", "eval.every_n_steps=0",
              "algorithm.prompts_per_step=8", f"hydra.run.dir={run}", tag=tag)
    assert "2 ranks (FSDP2 1 x TP 2)" in p.stdout and "{'procs': 2}" in p.stdout
    rows = [r for r in metrics(run) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the titan generator samples the gathered weights: its logprobs match the TP trainer's closely
    assert all(r["logprob_diff/max"] < 1e-4 for r in rows)
    assert (run / "checkpoints" / "final" / "model.safetensors").exists()
    assert wait_no_orphans(tag) == []


def test_layout_spanning_hosts_is_refused_and_gpus_are_assigned_per_role() -> None:
    """qwen3_32b's default trainer (FSDP 8 x TP 2) needs 16 GPUs and, without hosts of its own, runs on this host.
    (The CUDA check that comes first in `validate` would stop this machine, so the hosts check `prepare` runs after
    it is called alone; `assign_gpus` is what the actors put in CUDA_VISIBLE_DEVICES.)"""
    from omegaconf import OmegaConf

    from rlexp.cluster.layout import assign_gpus, check_hosts_fit

    c = OmegaConf.structured(TrainConfig)
    from rlexp.evals.cli import model_config

    c.model = OmegaConf.structured(model_config("qwen3_32b"))  # the model's numbers, not what its run brings
    c.cluster.device, c.cluster.gpus_per_host = "cuda", 8
    c.generator.backend, c.generator.replicas, c.generator.tp = "vllm", 1, 4
    c = OmegaConf.to_object(c)  # the typed config, with its derived values, as `prepare` hands it on
    with pytest.raises(ConfigError, match=r"gpus_per_host=8; needed per host: local: 20; trainer 8 x 2, "
                                          r"generators 1 x 4"):
        check_hosts_fit(c)
    c.model.parallelism.trainer_fsdp, c.model.parallelism.trainer_tp = 2, 2
    check_hosts_fit(c)  # 4 + 4 = 8 fits
    assert assign_gpus(c) == {"trainer": ["0", "1", "2", "3"], "generator0": ["4,5,6,7"]}
    c.cluster.device = "cpu"
    assert assign_gpus(c) == {}
