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

Precision, as TorchTitan trains: the *trained* copy keeps fp32 master weights (parameters, gradients and
AdamW state fp32, whatever `model.dtype` says) and computes in the serving dtype `model.dtype` (bf16 for every
Qwen3 preset), or bf16 under `trainer.mixed_precision`: FSDP2's `MixedPrecisionPolicy(param_dtype=compute,
reduce_dtype=fp32)` when sharded, `compute_in` (the same cast, per module) on one rank. Why: bf16 weights
cannot take an AdamW step of lr 1e-6 (a bf16 weight of magnitude ~0.02 moves in steps of ~1e-4; at lr 1e-6
2% of a bf16 model's weights moved, all of them in fp32), so a run would print healthy losses and not learn.
What the generators see: the titan generator's bf16 model computes op for op what the trainer's bf16 cast of its
fp32 masters computes, so their logprobs agree bit for bit in bf16 as in fp32 when the batches match
(tests/test_master_weights.py); vLLM's bf16 kernels differ from them by rounding (~1e-2 in logprob_diff). Under
`trainer.mixed_precision` with an fp32 `model.dtype` one rank keeps bf16 autocast around the forward (fp32 norms
and residuals) and the generators stay fp32: they differ by bf16 rounding. The reference model (frozen) and the
generators hold the serving dtype; the weights pushed to generators and the exported HF checkpoint are cast to
it, the trainer's checkpoints keep the fp32 masters. Memory per trained
parameter: 4 (fp32 param) + 4 (fp32 grad) + 8 (AdamW m, v) = 16 B / shards, plus a transient compute-dtype copy
(2 B bf16) of the unsharded units in use (FSDP2) or, on one rank, of every weight for the forward and backward.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn as nn

from rlexp.config.model import DType, ModelConfig
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


def compute_dtype(cfg: ModelConfig, mixed_precision: bool) -> torch.dtype:
    """The dtype a policy's forward and backward run in: the serving dtype `model.dtype` (what the generators
    hold), or bf16 under `trainer.mixed_precision`."""
    return torch.bfloat16 if mixed_precision else torch_dtype(cfg.dtype)


def _cast_buffers(model: nn.Module, dtype: torch.dtype) -> None:
    """Floating buffers (the RoPE cos/sin cache) in `dtype`, as the generators' model (built fp32, then cast
    whole to the serving dtype) holds them: the same cache, hence the same logprobs."""
    for m in model.modules():
        for name, b in m._buffers.items():
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                m._buffers[name] = b.to(dtype)


def compute_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Run `model`'s forward (and activation checkpointing's recompute) with every parameter cast to `dtype`,
    while the parameters the optimizer steps stay fp32: FSDP2's `MixedPrecisionPolicy(param_dtype=dtype)` for one
    unsharded rank. Each module with parameters of its own casts them in a forward pre-hook and puts the fp32
    ones back after its forward (also when it raises); the cast is differentiable, so gradients reach the fp32
    parameters in fp32. The compute is then op for op a `dtype` model's, as the generators run it."""

    def cast(mod: nn.Module, _args: Any) -> None:
        mod._rlexp_master = dict(mod._parameters)  # type: ignore[assignment]
        for n, p in mod._rlexp_master.items():  # type: ignore[union-attr]
            if p is not None and p.is_floating_point():
                mod._parameters[n] = p.to(dtype)  # type: ignore[assignment]

    def restore(mod: nn.Module, _args: Any, _out: Any) -> None:
        master = mod.__dict__.pop("_rlexp_master", None)
        if master is not None:
            mod._parameters.update(master)

    for m in model.modules():
        if any(True for _ in m.parameters(recurse=False)):
            m.register_forward_pre_hook(cast)
            m.register_forward_hook(restore, always_call=True)


def build_sharded_policy(cfg: ModelConfig, model_dir: str, dims: Any, device: torch.device, *,
                         activation_checkpointing: bool = False, mixed_precision: bool = False,
                         master_fp32: bool = False) -> nn.Module:
    """TorchTitan Qwen3 built on meta, tensor-parallel over `dims`' tp axis, FSDP2-sharded over its
    fsdp axis (blocks, then root), HF weights loaded. Collective: every rank calls it.

    A small version of TorchTitan's `parallelize_qwen3` (dense; TP without sequence parallelism): TP is
    TorchTitan's own plan, AC comes before sharding, and `master_fp32` (the trainer) keeps fp32 sharded
    parameters that FSDP2 casts to the compute dtype when it all-gathers them
    (`MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=fp32)`); the reference model keeps `model.dtype`.
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


    tc = titan_config(cfg.arch)
    if dims.tp > 1:
        from torchtitan.models.qwen3.sharding import set_qwen3_sharding_config

        set_qwen3_sharding_config(tc, enable_sp=False, enable_ep=False)
    param_dtype = torch.float32 if master_fp32 else torch_dtype(cfg.dtype)
    compute = compute_dtype(cfg, mixed_precision)
    with torch.device("meta"):
        model = tc.build().to(dtype=param_dtype)
    if dims.tp > 1:
        model.parallelize(dims)
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32) if compute != param_dtype \
        else MixedPrecisionPolicy()
    mesh = dims.get_mesh("fsdp")
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_states(buffer_device=device)  # RoPE cache; the parameters are overwritten just below
    _cast_buffers(model, torch_dtype(cfg.dtype))
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


def build_policy(settings: PolicySettings, rank: int, device: torch.device, *, train: bool = False
                 ) -> tuple[nn.Module, Any]:
    """The policy for this rank (plain on one rank, TP/FSDP-sharded on several) and its `ParallelDims`
    (None on one rank). `train`: the trainer's copy, fp32 master weights computing in the serving dtype (module
    docstring); otherwise (the reference model) the serving dtype throughout. Collective when sharded."""
    ranks = settings.ranks
    cfg = settings.model
    if ranks.world == 1:
        serving = torch_dtype(cfg.dtype)
        if not train or serving == torch.float32:
            model = load_policy(cfg, settings.model_dir, device=str(device))
        else:
            model = load_policy(replace(cfg, dtype=DType.float32), settings.model_dir, device=str(device))
            _cast_buffers(model, serving)
            compute_in(model, serving)
        if settings.activation_checkpointing:
            apply_activation_checkpointing(model)
        return model, None
    dims = init_parallel(rank, ranks.world, ranks.tp, ranks.master_port, device)
    return build_sharded_policy(cfg, settings.model_dir, dims, device,
                                activation_checkpointing=settings.activation_checkpointing,
                                mixed_precision=settings.mixed_precision, master_fp32=train), dims


def loss_parallel_if(tp: int) -> Any:
    """`loss_parallel` under TP (the logprobs of vocabulary-sharded logits need it, forward and backward)."""
    if tp == 1:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()
