"""The trainer actor: TorchTitan Qwen3, AdamW, LR schedule, the GRPO loss, checkpoints, weight pushes."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from monarch.actor import Actor, endpoint

from rlexp.actors.policy import load_policy, sequence_logprobs
from rlexp.grpo import grpo_loss
from rlexp.models.config import ModelConfig


@dataclass
class TrainBatch:
    prompts: list[list[int]]
    responses: list[list[int]]
    old_logprobs: list[list[float]]  # the generator's logprobs of the sampled tokens
    advantages: list[float]
    ref_logprobs: list[list[float]] | None = None


def lr_lambda(schedule: str, warmup: int, total: int, min_ratio: float):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - (1.0 - min_ratio) * frac
        if schedule == "cosine":
            return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * frac))
        raise ValueError(f"trainer.lr_schedule={schedule!r} is not one of constant, linear, cosine")

    return f


def _pad(rows: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r[:width])
    return out


class Trainer(Actor):
    def __init__(self, model_cfg: ModelConfig, model_dir: str, trainer_cfg: Any, algo_cfg: Any, total_steps: int,
                 seed: int, pad_id: int, transport: str, run_name: str, threads: int = 0,
                 shm_dir: str | None = None) -> None:
        self.shm_dir = shm_dir
        self.model_cfg, self.model_dir = model_cfg, model_dir
        self.tcfg, self.acfg = trainer_cfg, algo_cfg
        self.total_steps, self.seed, self.pad_id = total_steps, seed, pad_id
        self.transport_name, self.run_name = transport, run_name
        if threads:
            torch.set_num_threads(threads)

    @endpoint
    async def setup(self) -> int:
        from rlexp.transport import build_transport

        torch.manual_seed(self.seed)  # nothing random today, but any future dropout/init draws from here
        self.model = load_policy(self.model_cfg, self.model_dir).train()
        t = self.tcfg
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=tuple(t.betas),
                                       weight_decay=t.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.optim, lr_lambda(t.lr_schedule, t.warmup_steps, self.total_steps, t.min_lr_ratio))
        self.transport = build_transport(self.transport_name, self.run_name, keep=4, root=self.shm_dir)
        self.version = 0
        return sum(p.numel() for p in self.model.parameters())

    @endpoint
    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        t0 = time.perf_counter()
        a = self.acfg
        n = len(batch.prompts)
        mb = max(1, min(self.tcfg.micro_batch_size, n))
        self.optim.zero_grad(set_to_none=True)
        total_tokens = sum(len(r) for r in batch.responses)
        metrics: dict[str, float] = {}
        diffs: list[torch.Tensor] = []
        for s in range(0, n, mb):
            e = min(n, s + mb)
            logp, mask = sequence_logprobs(self.model, batch.prompts[s:e], batch.responses[s:e], a.temperature,
                                           self.pad_id)
            old = _pad(batch.old_logprobs[s:e], logp.shape[1])
            ref = _pad(batch.ref_logprobs[s:e], logp.shape[1]) if batch.ref_logprobs else None
            out = grpo_loss(logp, old, torch.tensor(batch.advantages[s:e]), mask, a.clip_low, a.clip_high, ref,
                            a.kl_coef, a.loss_agg, max_len=a.max_tokens)
            # Weight each micro-batch by its share, so accumulation equals one big batch.
            share = (mask.sum().item() / max(1, total_tokens)) if a.loss_agg == "token_mean" else (e - s) / n
            (out.loss * share).backward()
            for k, v in out.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v * share
            diffs.append(((logp.detach() - old).abs() * mask).flatten()[mask.flatten() > 0])
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tcfg.grad_clip)
        self.optim.step()
        self.sched.step()
        d = torch.cat(diffs)
        metrics.update({
            "loss": metrics.get("loss/policy", 0.0),
            "train/grad_norm": float(grad_norm),
            "train/lr": float(self.sched.get_last_lr()[0]),
            # generator vs trainer logprobs on the sampled tokens, before this update
            "logprob_diff/max": float(d.max()) if d.numel() else 0.0,
            "logprob_diff/mean": float(d.mean()) if d.numel() else 0.0,
            "time/train_step_s": time.perf_counter() - t0,
        })
        return metrics

    @endpoint
    async def push_weights(self, version: int) -> str:
        """Publish the current weights (HF naming) as `version`; returns where generators read them."""
        from rlexp.models.titan import hf_state_dict

        self.version = version
        return self.transport.publish(version, hf_state_dict(self.model, self.model_cfg.arch))

    @endpoint
    async def save(self, path: str) -> None:
        tmp = Path(path + ".tmp")
        torch.save({"model": self.model.state_dict(), "optim": self.optim.state_dict(),
                    "sched": self.sched.state_dict(), "version": self.version}, tmp)
        tmp.replace(path)

    @endpoint
    async def load(self, path: str) -> int:
        state = torch.load(path, map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optim.load_state_dict(state["optim"])
        self.sched.load_state_dict(state["sched"])
        self.version = int(state["version"])
        return self.version

    @endpoint
    async def export_hf(self, out_dir: str) -> str:
        """Final checkpoint as an HF folder (what `rlexp eval run_dir=...` and vLLM load)."""
        from rlexp.models.hf import save_titan_as_hf

        save_titan_as_hf(self.model, out_dir, self.model_cfg, source_dir=self.model_dir)
        return out_dir

    @endpoint
    async def shutdown(self) -> None:
        self.transport.close()


class Reference(Actor):
    """Frozen copy of the initial policy; only spawned when `algorithm.kl_coef > 0`."""

    def __init__(self, model_cfg: ModelConfig, model_dir: str, pad_id: int, threads: int = 0) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.model = load_policy(model_cfg, model_dir).eval()
        self.pad_id = pad_id

    @endpoint
    async def logprobs(self, prompts: list[list[int]], responses: list[list[int]], temperature: float) -> list[list[float]]:
        with torch.no_grad():
            logp, mask = sequence_logprobs(self.model, prompts, responses, temperature, self.pad_id)
        return [row[: int(m.sum())].tolist() for row, m in zip(logp, mask)]
