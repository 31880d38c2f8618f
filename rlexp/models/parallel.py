"""The policy as one rank holds it: plain on one rank, TensorParallel + FSDP2 on several (TorchTitan's way).

The trainer and the reference model both build their copy here, so the actors in rlexp/actors/ only hold
state and answer endpoints. Each rank builds the model on the meta device and parallelises it the way
TorchTitan's `parallelize_qwen3` does, on a 2-D (fsdp, tp) mesh with tp innermost:
  - TP: TorchTitan's own Qwen3 sharding plan (`set_qwen3_sharding_config`, then `Module.parallelize`):
    fused QKV / w1 / w3 column-wise, wo / w2 row-wise, vocab-parallel embedding and lm_head. Logits
    stay sharded over the vocabulary; token logprobs come from a loss-parallel cross-entropy
    (`rlexp.models.policy.sequence_logprobs`), so no rank ever holds a full [tokens x vocab] tensor.
  - FSDP2 on the fsdp axis (each transformer block, then the root), even at degree 1, as TorchTitan
    does, so mixed precision has one code path.
Each rank loads its shard of the HF checkpoint.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from rlexp.config.model import ModelConfig
from rlexp.models.hf import load_hf_into_sharded_titan
from rlexp.models.policy import load_policy
from rlexp.models.titan import titan_config, torch_dtype


@dataclass(frozen=True)
class Ranks:
    """Where one copy of the policy runs: its ranks, device and threads. `world` ranks in (fsdp x tp) with tp
    innermost; `gpus[rank]` is a rank's CUDA_VISIBLE_DEVICES on CUDA (None on CPU); `master_port` is a port on
    this host, or "host:port" when rank 0 runs on another host."""

    world: int = 1
    tp: int = 1
    device: str = "cpu"
    gpus: list[str] | None = None
    threads: int = 0
    master_port: int | str = 0


@dataclass(frozen=True)
class PolicySettings:
    """A policy copy that the trainer trains or the reference model keeps frozen."""

    model: ModelConfig
    model_dir: str
    pad_id: int
    ranks: Ranks = field(default_factory=Ranks)
    mixed_precision: bool = False
    activation_checkpointing: bool = False


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


def full_tensor(v: Any) -> Any:
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

    # `master_port` is a port on this host, or "host:port" when rank 0 runs on another host (rlexp/run/launcher.py).
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


def build_policy(settings: PolicySettings, rank: int, device: torch.device) -> tuple[nn.Module, Any]:
    """The policy for this rank (plain on one rank, TP/FSDP-sharded on several) and its `ParallelDims`
    (None on one rank). Collective when sharded."""
    ranks = settings.ranks
    if ranks.world == 1:
        model = load_policy(settings.model, settings.model_dir, device=str(device))
        if settings.activation_checkpointing:
            apply_activation_checkpointing(model)
        return model, None
    dims = init_parallel(rank, ranks.world, ranks.tp, ranks.master_port, device)
    return build_sharded_policy(settings.model, settings.model_dir, dims, device,
                                activation_checkpointing=settings.activation_checkpointing,
                                mixed_precision=settings.mixed_precision), dims


def loss_parallel_if(tp: int) -> Any:
    """`loss_parallel` under TP (the logprobs of vocabulary-sharded logits need it, forward and backward)."""
    if tp == 1:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()
