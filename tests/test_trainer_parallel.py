"""The trainer sharded with FSDP2 over 2 CPU ranks (gloo), through real Monarch actors.

One 2-proc mesh is spawned once; several Trainer actors live on it (the process group is per process
and shared), the single-rank ones on its first proc. Same batches in, then compared:
  - 2 ranks vs 1 rank (fp32): weights after 3 steps agree to 1e-5 (measured max |diff| ~2e-6: the
    reduce-scatter and the sharded grad norm sum in a different order, so not bitwise);
  - a checkpoint written by 2 ranks resumes 2 ranks bit for bit and 1 rank to the same tolerance;
  - activation checkpointing: bitwise the same loss, grads and weights as without;
  - bf16 mixed precision (FSDP2 MixedPrecisionPolicy / autocast): loss within 2e-2 of fp32, fp32 master weights.
Plus `rlexp train model.parallelism.trainer_fsdp=2` end to end. Tensor parallelism: tests/test_trainer_tp.py.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rlexp.actors.settings import TrainerSettings
from rlexp.actors.trainer import Trainer
from rlexp.algorithm.grpo import grpo_loss
from rlexp.config.model import ArchConfig, ModelConfig
from rlexp.config.schema import AlgorithmConfig, TrainerConfig
from rlexp.core.weights import read_hf_state_dict
from rlexp.models.parallel import PolicySettings, Ranks, apply_activation_checkpointing
from rlexp.models.policy import load_policy, sequence_logprobs
from rlexp.models.tiny import ensure_tiny_checkpoint
from rlexp.transport import TransportSpec
from rlexp.types import TrainBatch
from tests.conftest import metrics, rlexp, wait_no_orphans
from tests.trainer_helpers import free_port, grpo_batch, max_diff, rank0, train_steps

pytestmark = pytest.mark.slow  # 2-rank FSDP trainers on Monarch actors, and `rlexp train` end to end

CFG = ModelConfig(arch=ArchConfig(max_seq_len=256, tie_embeddings=True))  # tiny Qwen3, tied embeddings, 2 layers
ALGO = AlgorithmConfig(max_tokens=4)
FSDP_VS_SINGLE_ATOL = 1e-5






@pytest.fixture(scope="module")
def env(tmp_path_factory, two_procs):
    d = str(ensure_tiny_checkpoint(CFG))
    # 12 rows, then 7 (odd: rank 0 gets 3, rank 1 gets 4 -> rank 0 runs a zero-weight micro-batch), then 12
    batches = [grpo_batch(CFG, d, 0, 3), _trim(grpo_batch(CFG, d, 1, 2), 7), grpo_batch(CFG, d, 2, 3)]
    two = two_procs  # the session's (tests/test_trainer_tp.py's too)
    one = two.slice(procs=0)  # single-rank trainers share rank 0's process (no process group use), saving a start
    port, shm = free_port(), tmp_path_factory.mktemp("shm")
    made: list = []

    def trainer(mesh, name: str, wait: bool = True, **tcfg) -> object:
        world = 2 if mesh is two else 1
        policy = PolicySettings(CFG, d, 0, Ranks(world=world, threads=1, master_port=port),
                                activation_checkpointing=tcfg.get("activation_checkpointing", False),
                                mixed_precision=tcfg.get("mixed_precision", False))
        settings = TrainerSettings(policy, TrainerConfig(micro_batch_size=3, **tcfg), ALGO, 10, 0)
        t = mesh.spawn(name, Trainer, settings,
                       transports=[TransportSpec("shm", "rlexp.transport.shm", name, {"root": str(shm)})])
        ready = t.setup.call()
        made.append(t)
        return ready.get() and t if wait else (t, ready)

    # The first trainer on each mesh pays the imports: start both before waiting for either.
    first = {"single": trainer(one, "single", wait=False), "fsdp": trainer(two, "fsdp", wait=False)}
    for _, ready in first.values():
        ready.get()

    yield {"dir": d, "batches": batches, "two": two, "one": one, "trainer": trainer, "tmp": shm, "port": port,
           "first": {k: t for k, (t, _) in first.items()}}
    for t in made:
        t.shutdown.call().get()


def _trim(b: TrainBatch, n: int) -> TrainBatch:
    return TrainBatch(b.prompts[:n], b.responses[:n], b.old_logprobs[:n], b.advantages[:n])








@pytest.fixture(scope="module")
def runs(env):
    """fp32 on 1 rank and on 2 ranks, 3 steps each; the 2-rank trainer also checkpoints after step 2."""
    b = env["batches"]
    single, fsdp = env["first"]["single"], env["first"]["fsdp"]
    out = {"single_m": train_steps(single, b), "fsdp_m": train_steps(fsdp, b[:2])}
    ckpt = str(env["tmp"] / "fsdp_step2.pt")
    rank0(fsdp, "save", ckpt)
    out["fsdp_m"] += train_steps(fsdp, b[2:])
    out.update(single=rank0(single, "full_hf_state_dict"), fsdp=rank0(fsdp, "full_hf_state_dict"), ckpt=ckpt)
    out["published"] = rank0(fsdp, "push_weights", 1)
    return out


def test_two_rank_fsdp_matches_single_rank(runs) -> None:
    diff = max_diff(runs["single"], runs["fsdp"])
    print(f"max |w_fsdp2 - w_single| after 3 steps: {diff:.3g}")
    assert 0 < diff < FSDP_VS_SINGLE_ATOL or diff == 0
    for a, b in zip(runs["single_m"], runs["fsdp_m"]):
        for k in ("loss", "train/grad_norm", "loss/clip_frac", "logprob_diff/mean",
                  "logprob_diff/max", "policy/entropy", "policy/kl_to_start"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
    assert runs["single_m"][-1]["loss"] != runs["single_m"][0]["loss"]  # it trained


def test_entropy_and_kl_to_start_on_the_sampled_tokens(env, runs) -> None:
    """`policy/entropy` is minus the mean logprob of the batch's tokens under the policy before
    the step; `policy/kl_to_start` is 0 at the first step (the policy is its start) and grows once
    it has trained. The 2-rank trainer (a zero-weight micro-batch on one rank in batch 1) reports
    the same (test above)."""
    b = env["batches"][0]
    with torch.no_grad():
        logp, mask = sequence_logprobs(load_policy(CFG, env["dir"]), b.prompts, b.responses, 1.0, 0)
    m = runs["single_m"]
    entropy = float(-(logp * mask).sum() / mask.sum())
    assert m[0]["policy/entropy"] == pytest.approx(entropy, rel=1e-5)
    assert m[0]["policy/kl_to_start"] == pytest.approx(0.0, abs=1e-9)
    assert m[1]["policy/kl_to_start"] > 0 and m[2]["policy/kl_to_start"] > 0
    # push_weights: rank 0 published the gathered weights (HF names) through the shm transport
    from rlexp.models.hf import read_hf_state_dict

    pub = read_hf_state_dict(runs["published"]["shm"])
    assert all(torch.equal(pub[k], runs["fsdp"][k]) for k in runs["fsdp"])


def test_two_rank_checkpoint_resumes_exactly_on_two_ranks_and_on_one(env, runs) -> None:
    last = env["batches"][2:]
    again = env["trainer"](env["two"], "fsdp_resumed")
    assert rank0(again, "load", runs["ckpt"]) == 0
    untimed = lambda ms: [{k: v for k, v in m.items() if not k.startswith("time/")} for m in ms]  # noqa: E731
    assert untimed(train_steps(again, last)) == untimed(runs["fsdp_m"][2:])
    assert max_diff(rank0(again, "full_hf_state_dict"), runs["fsdp"]) == 0.0  # sharded resume is exact
    one = env["trainer"](env["one"], "single_from_fsdp")
    rank0(one, "load", runs["ckpt"])
    train_steps(one, last)
    assert max_diff(rank0(one, "full_hf_state_dict"), runs["single"]) < FSDP_VS_SINGLE_ATOL


def test_activation_checkpointing_same_loss_and_grads(env, runs) -> None:
    b = env["batches"][0]
    grads, losses = [], []
    for ac in (False, True):
        model = load_policy(CFG, env["dir"]).train()
        if ac:
            apply_activation_checkpointing(model)
        logp, mask = sequence_logprobs(model, b.prompts, b.responses, 1.0, 0)
        old = torch.zeros_like(logp)
        for i, r in enumerate(b.old_logprobs):
            old[i, : len(r)] = torch.tensor(r)
        out = grpo_loss(logp, old, torch.tensor(b.advantages), mask, 0.2, 0.2, None, 0.0, "token_mean")
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()})
    assert torch.equal(losses[0], losses[1])
    assert grads[0].keys() == grads[1].keys() and all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])
    # and sharded, through the actors: the same training run bit for bit
    ac = env["trainer"](env["two"], "fsdp_ac", activation_checkpointing=True)
    m = train_steps(ac, env["batches"])
    assert [x["loss"] for x in m] == [x["loss"] for x in runs["fsdp_m"]]
    assert [x["train/grad_norm"] for x in m] == [x["train/grad_norm"] for x in runs["fsdp_m"]]
    assert max_diff(rank0(ac, "full_hf_state_dict"), runs["fsdp"]) == 0.0


@pytest.mark.parametrize("world", [2, 1])
def test_bf16_mixed_precision_trains_close_to_fp32(env, runs, world: int) -> None:
    t = env["trainer"](env["two"] if world == 2 else env["one"], f"mp{world}", mixed_precision=True)
    m = train_steps(t, env["batches"])
    ref = runs["fsdp_m"] if world == 2 else runs["single_m"]
    diffs = [abs(a["loss"] - b["loss"]) for a, b in zip(m, ref)]
    print(f"bf16 ({world} rank) vs fp32 loss |diff| per step: {[f'{d:.2g}' for d in diffs]}")
    assert max(diffs) < 2e-2
    assert diffs[0] > 0  # bf16 really was used for the forward
    sd = rank0(t, "full_hf_state_dict")
    assert all(v.dtype == torch.float32 for v in sd.values())  # fp32 master weights
    assert max_diff(sd, runs["single"]) < 1e-2


@pytest.mark.parametrize("world", [2, 1])
def test_a_bf16_model_keeps_fp32_masters_and_moves_every_weight_at_lr_1e_6(env, world: int) -> None:
    """`model.dtype: bfloat16` (every Qwen3 preset) trains fp32 master weights (FSDP2 casts them to bf16 for the
    compute; one rank casts per module): one AdamW step at lr 1e-6 moves nearly every weight. Trained in bf16, as
    before, 2% of them moved (tests/test_master_weights.py measures that build)."""
    cfg = replace(CFG, dtype="bfloat16")
    d = str(ensure_tiny_checkpoint(cfg))
    mesh = env["two"] if world == 2 else env["one"]
    policy = PolicySettings(cfg, d, 0, Ranks(world=world, threads=1, master_port=env["port"]))
    name = f"bf16_master{world}"
    t = mesh.spawn(name, Trainer, TrainerSettings(policy, TrainerConfig(lr=1e-6, micro_batch_size=3), ALGO, 10, 0),
                   transports=[TransportSpec("shm", "rlexp.transport.shm", name, {"root": str(env["tmp"])})])
    t.setup.call().get()
    try:
        before = rank0(t, "full_hf_state_dict")
        assert {v.dtype for v in before.values()} == {torch.float32}
        train_steps(t, [grpo_batch(cfg, d, 0, 3)])
        after = rank0(t, "full_hf_state_dict")
        moved = sum(int((after[k] != before[k]).sum()) for k in before)
        total = sum(v.numel() for v in before.values())
        assert moved > 0.9 * total, f"{moved:,} of {total:,} weights moved"
    finally:
        t.shutdown.call().get()


def test_rlexp_train_with_fsdp2_trainer_end_to_end(tmp_path: Path, tag: str) -> None:
    run = tmp_path / "run"
    p = rlexp("train", "model.parallelism.trainer_fsdp=2", "steps=3", "eval.every_n_steps=0",
              "checkpoint.every_n_steps=2", "algorithm.prompts_per_step=8", f"hydra.run.dir={run}", tag=tag)
    assert "2 ranks (FSDP2 2 x TP 1)" in p.stdout and "{'procs': 2}" in p.stdout
    rows = metrics(run)
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3] and rows[-1]["step"] == 3
    # the titan generator samples the gathered weights: on-policy logprobs match the sharded trainer's
    assert all(r["logprob_diff/max"] < 1e-4 for r in rows if "loss" in r)
    assert (run / "checkpoints" / "step_000002" / "COMPLETE").exists()
    assert (run / "checkpoints" / "final" / "model.safetensors").exists()
    assert wait_no_orphans(tag) == []


def test_the_weight_average_on_two_ranks_is_the_single_ranks(tmp_path: Path, tag: str) -> None:
    """`trainer.ema_decay` on a sharded trainer: each rank averages its shards, the export gathers them, and a
    resume on two ranks reloads them; the result is the single-rank average up to summation order."""
    # A step before the resumed checkpoint and one after it; an evaluation (of the average) at
    # each step, of 8 problems: it pushes the average to the generators and the live weights back.
    common = ["steps=2", "eval.every_n_steps=1", "eval.max_samples=8",
              "algorithm.prompts_per_step=8", "trainer.ema_decay=0.5", "checkpoint.every_n_steps=1"]
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    rlexp("train", *common, f"hydra.run.dir={one}", tag=tag)
    rlexp("train", *common, "model.parallelism.trainer_fsdp=2", f"hydra.run.dir={two}", tag=tag)
    rlexp("train", *common, "model.parallelism.trainer_fsdp=2", f"resume={two / 'checkpoints' / 'step_000001'}",
          f"hydra.run.dir={resumed}", tag=tag)
    a, b, c = (read_hf_state_dict(r / "checkpoints" / "final") for r in (one, two, resumed))
    assert max_diff(b, a) < 1e-4  # summation order (the gradients of two ranks are added, then averaged)
    assert max_diff(c, b) < 1e-6
    assert wait_no_orphans(tag) == []
