"""The trainer actor: TorchTitan Qwen3, AdamW, LR schedule, the GRPO loss, checkpoints, weight pushes.

One rank (the default) is a plain module in one process, no process group. With
`trainer_fsdp * trainer_tp > 1` the launcher spawns one Trainer per rank on a proc mesh; every
endpoint is then collective (`rlexp.services.Collective` calls it on the whole mesh and keeps rank 0's answer).
Each rank builds the model on the meta device and parallelises it the way TorchTitan's
`parallelize_qwen3` does, on a 2-D (fsdp, tp) mesh with tp innermost:
  - TP: TorchTitan's own Qwen3 sharding plan (`set_qwen3_sharding_config`, then `Module.parallelize`):
    fused QKV / w1 / w3 column-wise, wo / w2 row-wise, vocab-parallel embedding and lm_head. Logits
    stay sharded over the vocabulary; token logprobs come from a loss-parallel cross-entropy
    (`rlexp.models.policy.sequence_logprobs`), so no rank ever holds a full [tokens x vocab] tensor.
  - FSDP2 on the fsdp axis (each transformer block, then the root), even at degree 1, as TorchTitan
    does, so mixed precision has one code path.
Each rank loads its shard of the HF checkpoint. The ranks of one TP group train on the same rows; the
fsdp ranks split every batch into contiguous slices. Losses are weighted by each micro-batch's share
of the *global* batch and FSDP's gradient division is off, so the reduced gradient is the single-rank
gradient (up to summation order). Checkpoints are gathered to rank 0 in the single-rank file format,
so any layout resumes any other.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from monarch.actor import Actor, current_rank, endpoint

from rlexp.checkpoints import safe_load
from rlexp.config.model import ModelConfig
from rlexp.grpo import LOSSES, policy_token_mask
from rlexp.models.hf import (
    load_hf_into_sharded_titan,
    save_titan_as_hf,
    titan_full_hf_state_dict,
)
from rlexp.models.policy import load_policy, sequence_logprobs
from rlexp.models.titan import hf_state_dict, titan_config, torch_dtype
from rlexp.plugins import activate_from_env
from rlexp.seeding import apply_process_determinism
from rlexp.transport import TransportSpec, WeightTransport, build_publisher
from rlexp.types import TrainBatch


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


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each transformer block in backward (non-reentrant), as TorchTitan's full AC does.
    State-dict keys are unchanged (the wrapper strips its prefix); the forward has no randomness."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    for name, block in list(model.layers.named_children()):
        model.layers.register_module(name, checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                                              preserve_rng_state=False))


def build_sharded_policy(cfg: ModelConfig, model_dir: str, dims: Any, device: torch.device, *,
                         activation_checkpointing: bool = False, mixed_precision: bool = False) -> nn.Module:
    """TorchTitan Qwen3 built on meta, tensor-parallel over `dims`' tp axis, FSDP2-sharded over its
    fsdp axis (blocks, then root), HF weights loaded. Collective: every rank calls it.

    A small version of TorchTitan's `parallelize_qwen3` (dense; TP without sequence parallelism): TP is
    TorchTitan's own plan, AC comes before sharding, mixed precision is FSDP2's
    `MixedPrecisionPolicy(bf16 params, fp32 reduce)` with fp32 sharded master weights.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


    tc = titan_config(cfg.arch)
    if dims.tp > 1:
        from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

        set_qwen3_sharding_config(tc, enable_sp=False, enable_ep=False)
    with torch.device("meta"):
        model = tc.build().to(dtype=torch_dtype(cfg.dtype))
    if dims.tp > 1:
        model.parallelize(dims)
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision \
        else MixedPrecisionPolicy()
    mesh = dims.get_mesh("fsdp")
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_states(buffer_device=device)  # RoPE cache; the parameters are overwritten just below
    for m in model.modules():
        if isinstance(m, FSDPModule):
            # Plain SUM of the ranks' gradients: each loss already carries its share of the global batch.
            # (Forcing SUM also avoids PREMUL_SUM, which gloo lacks.)
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    load_hf_into_sharded_titan(model, model_dir, cfg)
    return model


def _full(v: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return v.full_tensor().cpu() if isinstance(v, DTensor) else v


def claim_device(device_kind: str, gpus: list[str] | None, rank: int) -> torch.device:
    """This rank's device. On CUDA the launcher hands each role its own GPUs (`gpus[rank]`, a
    CUDA_VISIBLE_DEVICES value), so the trainer never lands on a generator's GPU; it must be set before
    anything in the process touches CUDA."""
    if device_kind != "cuda":
        return torch.device("cpu")
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[rank]
    torch.cuda.set_device(0 if gpus else rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def init_parallel(rank: int, world: int, tp: int, master_port: int | str, device: torch.device) -> Any:
    """Process group (gloo on CPU, nccl on CUDA) + TorchTitan's `ParallelDims` meshes (fsdp x tp, tp
    innermost); rank = Monarch rank. A second actor on the same processes (the reference model, or a
    test's second trainer) reuses the group and builds its own meshes."""
    import torch.distributed as dist

    # ParallelDims gives size-1 mesh axes (pp, cp, ...) the "fake" c10d backend; this registers it
    # (TorchTitan's training script gets it transitively through spmd_types).
    import torch.testing._internal.distributed.fake_pg  # noqa: F401
    import torchtitan.distributed.parallel_dims as titan_dims

    # `master_port` is a port on this host, or "host:port" when rank 0 runs on another host (rlexp/launcher.py).
    addr, _, port = str(master_port).rpartition(":")
    os.environ.update(MASTER_ADDR=addr or "127.0.0.1", MASTER_PORT=port)
    if device.type == "cpu":
        titan_dims.device_type = "cpu"  # TorchTitan assumes "cuda" when it finds no accelerator
    if not dist.is_initialized():
        if device.type == "cuda":
            dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world)
    elif dist.get_world_size() != world or dist.get_rank() != rank:
        raise RuntimeError(f"trainer rank {rank}/{world}: this process already belongs to a process group as "
                           f"rank {dist.get_rank()}/{dist.get_world_size()}")
    # "partial_dtensor": DTensors for the model-parallel (tp) axis only; FSDP2 shards on top.
    dims = titan_dims.ParallelDims(dp_replicate=1, dp_shard=world // tp, cp=1, tp=tp, pp=1, ep=1,
                                   world_size=world, spmd_backend="partial_dtensor")
    dims.build_mesh()
    return dims


def build_policy(cfg: ModelConfig, model_dir: str, rank: int, world: int, tp: int, master_port: int | str,
                 device: torch.device, *, activation_checkpointing: bool = False, mixed_precision: bool = False
                 ) -> tuple[nn.Module, Any]:
    """The policy for this rank (plain on one rank, TP/FSDP-sharded on several) and its `ParallelDims`
    (None on one rank). Collective when sharded."""
    if world == 1:
        model = load_policy(cfg, model_dir, device=str(device))
        if activation_checkpointing:
            apply_activation_checkpointing(model)
        return model, None
    dims = init_parallel(rank, world, tp, master_port, device)
    return build_sharded_policy(cfg, model_dir, dims, device, activation_checkpointing=activation_checkpointing,
                                mixed_precision=mixed_precision), dims


def loss_parallel_if(tp: int) -> Any:
    """`loss_parallel` under TP (the logprobs of vocabulary-sharded logits need it, forward and backward)."""
    if tp == 1:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


class Trainer(Actor):
    def __init__(self, model_cfg: ModelConfig, model_dir: str, trainer_cfg: Any, algo_cfg: Any, total_steps: int,
                 seed: int, pad_id: int, transports: Sequence[TransportSpec], threads: int = 0,
                 world_size: int = 1, master_port: int | str = 0, device: str = "cpu",
                 tp: int = 1, gpus: list[str] | None = None) -> None:
        activate_from_env()  # the user's plug-ins, before any name in the config is looked up
        apply_process_determinism()
        self.model_cfg, self.model_dir = model_cfg, model_dir
        self.tcfg, self.acfg = trainer_cfg, algo_cfg
        self.loss_fn = LOSSES.get(str(algo_cfg.loss))()  # checked in prepare; a plug-in's class needs its module here
        self.total_steps, self.seed, self.pad_id = total_steps, seed, pad_id
        # Every transport the generators need (resolved per pair by the launcher); a version is published to each.
        self.transport_specs = list({s.name: s for s in transports}.values())
        self.world, self.master_port, self.device_kind = world_size, master_port, device
        self.rank = current_rank().rank if world_size > 1 else 0
        if world_size % tp:
            raise ValueError(f"trainer: world size {world_size} is not a multiple of trainer_tp={tp}")
        self.tp = tp
        # Data-parallel coordinates: the ranks of one TP group (consecutive ranks) share their rows.
        self.dp_rank, self.dp_world = self.rank // tp, world_size // tp
        self.dp_group: Any = None
        self.device = claim_device(device, gpus, self.rank)
        self.transports: dict[str, WeightTransport] = {}
        if threads:
            torch.set_num_threads(threads)

    @endpoint
    async def setup(self) -> int:
        torch.manual_seed(self.seed)  # nothing random today, but any future dropout/init draws from here
        t = self.tcfg
        self.model, dims = build_policy(self.model_cfg, self.model_dir, self.rank, self.world, self.tp,
                                        self.master_port, self.device,
                                        activation_checkpointing=t.activation_checkpointing,
                                        mixed_precision=t.mixed_precision)
        self.model.train()
        if dims is not None:
            self.dp_group = dims.get_mesh("fsdp").get_group()
        # Unsharded mixed precision: bf16 autocast around the forward (fp32 master weights, fp32 log-softmax).
        self.autocast = torch.bfloat16 if t.mixed_precision and self.world == 1 else None
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=tuple(t.betas),
                                       weight_decay=t.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.optim, lr_lambda(t.lr_schedule, t.warmup_steps, self.total_steps, t.min_lr_ratio))
        if self.rank == 0:
            for spec in self.transport_specs:
                self.transports[spec.name] = build_publisher(spec, keep=4)
                await self.transports[spec.name].astart()
        self.version = 0
        return sum(p.numel() for p in self.model.parameters())

    @endpoint
    async def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on `batch`. Sharded: every rank gets the whole batch and trains on rows
        [d*n/D, (d+1)*n/D) of it, d its data-parallel rank among D (TP peers share rows); all ranks run
        the same number of micro-batches (a rank that has run out of rows runs a zero-weight one, so the
        collectives stay matched). Under TP, forward and backward run in `loss_parallel`, which lets the
        logprobs be computed from vocabulary-sharded logits."""
        t0 = time.perf_counter()
        a = self.acfg
        n = len(batch.prompts)
        mb = max(1, min(self.tcfg.micro_batch_size, n))
        lo, hi = self.dp_rank * n // self.dp_world, (self.dp_rank + 1) * n // self.dp_world
        n_micro = math.ceil(math.ceil(n / self.dp_world) / mb)
        self.optim.zero_grad(set_to_none=True)
        # Multi-turn rows train on the policy's tokens only: environment tokens are context, not actions.
        total_tokens = sum(len(r) for r in batch.responses) if batch.loss_masks is None \
            else sum(sum(m) for m in batch.loss_masks)
        metrics: dict[str, float] = {}
        diffs: list[torch.Tensor] = []
        for i in range(n_micro):
            s = lo + i * mb
            e = min(hi, s + mb)
            dummy = s >= e
            if dummy:
                s, e = 0, 1
            with loss_parallel_if(self.tp):
                logp, mask = sequence_logprobs(self.model, batch.prompts[s:e], batch.responses[s:e],
                                               a.temperature, self.pad_id, self.device, self.autocast)
                if batch.loss_masks is not None:
                    mask = policy_token_mask(mask, _pad(batch.loss_masks[s:e], logp.shape[1]).to(mask.device))
                old = _pad(batch.old_logprobs[s:e], logp.shape[1]).to(logp.device)
                ref = _pad(batch.ref_logprobs[s:e], logp.shape[1]).to(logp.device) if batch.ref_logprobs else None
                out = self.loss_fn(logp, old, torch.tensor(batch.advantages[s:e]).to(logp.device), mask, ref, a)
                # Weight each micro-batch by its share of the global batch, so accumulation (and the sum
                # over data-parallel ranks) equals one big batch.
                share = (mask.sum().item() / max(1, total_tokens)) if a.loss_agg == "token_mean" else (e - s) / n
                if dummy:
                    share = 0.0
                (out.loss * share).backward()
            for k, v in out.metrics.items():
                metrics[k] = metrics.get(k, 0.0) + v * share
            if not dummy:
                diffs.append(((logp.detach() - old).abs() * mask).flatten()[mask.flatten() > 0].cpu())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tcfg.grad_clip)
        self.optim.step()
        self.sched.step()
        d = torch.cat(diffs) if diffs else torch.zeros(0)
        d_max, d_sum, d_n = (float(d.max()) if d.numel() else 0.0), float(d.sum()), float(d.numel())
        if self.world > 1:
            metrics, d_max, d_sum, d_n = self._all_reduce_metrics(metrics, d_max, d_sum, d_n)
        metrics.update({
            "loss": metrics.get("loss/policy", 0.0),
            "train/grad_norm": float(_full(grad_norm)),
            "train/lr": float(self.sched.get_last_lr()[0]),
            # generator vs trainer logprobs on the sampled tokens, before this update
            "logprob_diff/max": d_max,
            "logprob_diff/mean": (float(d.mean()) if d.numel() else 0.0) if self.world == 1 else d_sum / max(1.0, d_n),
            "time/train_step_s": time.perf_counter() - t0,
        })
        return metrics

    def _all_reduce_metrics(self, metrics: dict[str, float], d_max: float, d_sum: float, d_n: float
                            ) -> tuple[dict[str, float], float, float, float]:
        """Share-weighted metric sums and logprob-diff sums/counts are summed over data-parallel ranks
        (TP peers computed the same rows); the max is maxed."""
        import torch.distributed as dist

        keys = sorted(metrics)  # every rank ran >= 1 micro-batch, so every rank has the same keys
        dev = self.device if self.device.type == "cuda" else torch.device("cpu")
        sums = torch.tensor([metrics[k] for k in keys] + [d_sum, d_n], dtype=torch.float64, device=dev)
        mx = torch.tensor([d_max], dtype=torch.float64, device=dev)
        dist.all_reduce(sums, group=self.dp_group)
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=self.dp_group)
        vals = sums.tolist()
        return dict(zip(keys, vals[:-2])), float(mx.item()), vals[-2], vals[-1]

    @endpoint
    async def push_weights(self, version: int) -> dict[str, str]:
        """Publish the current weights (HF naming) as `version`, once per transport the generators need;
        returns {transport: location} (rank 0's answer; every rank takes part in the all-gather when
        sharded). Each generator picks its own transport's location."""
        self.version = version
        sd = (hf_state_dict(self.model, self.model_cfg.arch) if self.world == 1
              else titan_full_hf_state_dict(self.model, self.model_cfg))
        if self.rank != 0:
            return {}
        return {name: await t.apublish(version, sd) for name, t in self.transports.items()}

    def _full_state(self) -> dict[str, Any]:
        """Model and optimizer state as full CPU tensors (the single-rank file format). Collective."""
        model: dict[str, torch.Tensor] = {}
        gathered: dict[int, torch.Tensor] = {}  # tied embeddings: gather the shared parameter once
        for k, v in self.model.state_dict().items():
            if id(v) not in gathered:
                gathered[id(v)] = _full(v)
            model[k] = gathered[id(v)]
        osd = self.optim.state_dict()
        osd["state"] = {i: {k: _full(v) for k, v in st.items()} for i, st in osd["state"].items()}
        return {"model": model, "optim": osd}

    @endpoint
    async def save(self, path: str) -> None:
        state = {"model": self.model.state_dict(), "optim": self.optim.state_dict()} if self.world == 1 \
            else self._full_state()
        if self.rank != 0:
            return
        tmp = Path(path + ".tmp")
        try:  # our own file object: closed (its space freed) at once when a full disk stops the write
            with open(tmp, "wb") as f:
                torch.save({**state, "sched": self.sched.state_dict(), "version": self.version}, f)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @endpoint
    async def load(self, path: str) -> int:
        """Load a trainer checkpoint (written by any number of ranks). Sharded: every rank reads the file
        and keeps its shard (`src_data_rank=None`: nothing is broadcast), like the HF load."""
        state = safe_load(Path(path))
        if self.world == 1:
            self.model.load_state_dict(state["model"])
            self.optim.load_state_dict(state["optim"])
        else:
            from torch.distributed.tensor import DTensor, distribute_tensor

            def shard(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
                if isinstance(like, DTensor):
                    return distribute_tensor(v.to(like.dtype), like.device_mesh, like.placements, src_data_rank=None)
                return v.to(device=like.device, dtype=like.dtype)

            current = self.model.state_dict()
            self.model.load_state_dict({k: shard(v, current[k]) for k, v in state["model"].items()})
            params = [p for g in self.optim.param_groups for p in g["params"]]  # state_dict's index order
            osd = state["optim"]
            osd["state"] = {i: {k: (shard(v, params[i]) if k != "step" and isinstance(params[i], DTensor) else v)
                                for k, v in st.items()} for i, st in osd["state"].items()}
            self.optim.load_state_dict(osd)
        self.sched.load_state_dict(state["sched"])
        self.version = int(state["version"])
        return self.version

    @endpoint
    async def export_hf(self, out_dir: str) -> str:
        """Final checkpoint as an HF folder (what `rlexp eval run_dir=...` and vLLM load); rank 0 writes."""
        if self.rank == 0:
            save_titan_as_hf(self.model, out_dir, self.model_cfg, source_dir=self.model_dir)
        else:
            titan_full_hf_state_dict(self.model, self.model_cfg)  # the same all-gathers rank 0 runs
        return out_dir

    @endpoint
    async def full_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights, gathered, in HF naming (tests and tools; collective when sharded)."""
        return titan_full_hf_state_dict(self.model, self.model_cfg)

    @endpoint
    async def layout(self) -> dict[str, Any]:
        """How parameters and logits are placed on this rank's mesh (diagnostics and tests)."""
        place = lambda t: [str(p) for p in t.placements] if hasattr(t, "placements") else []  # noqa: E731
        with torch.no_grad(), loss_parallel_if(self.tp):
            logits = self.model(torch.zeros(1, 2, dtype=torch.long, device=self.device))
        return {"params": {n: place(p) for n, p in self.model.named_parameters()}, "logits": place(logits)}

    @endpoint
    async def shutdown(self) -> None:
        for t in self.transports.values():
            t.close()
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


class Reference(Actor):
    """Frozen copy of the initial policy; only spawned when `algorithm.kl_coef > 0`.

    It lives on the trainer's processes and is sharded the same way (what `rlexp plan` counts: its
    weights share the trainer's GPUs), so a reference for an 8B model is neither a ninth GPU nor a CPU
    copy. Its endpoints are collective when the trainer has several ranks.
    """

    def __init__(self, model_cfg: ModelConfig, model_dir: str, pad_id: int, threads: int = 0, world_size: int = 1,
                 master_port: int | str = 0, device: str = "cpu", tp: int = 1, gpus: list[str] | None = None,
                 mixed_precision: bool = False) -> None:
        apply_process_determinism()
        if threads:
            torch.set_num_threads(threads)
        self.args = (model_cfg, model_dir, world_size, master_port, tp, mixed_precision)
        self.rank = current_rank().rank if world_size > 1 else 0
        self.device = claim_device(device, gpus, self.rank)
        self.pad_id, self.tp = pad_id, tp

    @endpoint
    async def setup(self) -> None:
        model_cfg, model_dir, world, port, tp, mp = self.args
        self.model, _ = build_policy(model_cfg, model_dir, self.rank, world, tp, port, self.device, mixed_precision=mp)
        self.model.eval()

    @endpoint
    async def logprobs(self, prompts: list[list[int]], responses: list[list[int]],
                       temperature: float) -> list[list[float]]:
        with torch.no_grad(), loss_parallel_if(self.tp):
            logp, mask = sequence_logprobs(self.model, prompts, responses, temperature, self.pad_id, self.device)
        return [row[: int(m.sum())].tolist() for row, m in zip(logp.cpu(), mask.cpu())]
