"""Everything that can be checked without spawning a process, done before anything is spawned.

Config values, the memory plan, transport pairing, model files, datasets and reward construction are
all checked here, so a bad input costs seconds, not an engine start. Nothing here holds a process.
"""
from __future__ import annotations

import copy
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.algorithm.grpo import LOSSES
from rlexp.cluster.cuda_env import check_driver
from rlexp.cluster.host_plan import check_context, check_host, sizes_of
from rlexp.cluster.hosts import check_cluster, weight_hosts
from rlexp.cluster.layout import assign_gpus, auto_threads, check_hosts_fit, controller_gpus
from rlexp.cluster.planner import PlanError, check_devices, plan_memory
from rlexp.cluster.registry import job_backend
from rlexp.config.model import ModelConfig
from rlexp.config.overrides import check_composed_keys
from rlexp.config.reward import VerifierConfig
from rlexp.config.schema import TrainConfig
from rlexp.config.typed import typed_config
from rlexp.config.validate import ConfigError, validate
from rlexp.core.plugins import (
    activate,
    describe_config_dirs,
    describe_plugins,
    export_used,
    search_paths,
    used_modules,
)
from rlexp.core.seeding import DETERMINISM_ENV, apply_process_determinism, component_seeds
from rlexp.envs.base import Environment
from rlexp.envs.registry import check_env_options
from rlexp.models.hf import check_model_files
from rlexp.models.tiny import ensure_tiny_checkpoint
from rlexp.rewards.base import Reward
from rlexp.run.inputs import (
    apply_checkpoint_limits,
    check_prompt_lengths,
    check_vocabulary,
    load_inputs,
    served_checkpoints,
)
from rlexp.run.preflight import check_multi_turn  # torch-free: `rlexp train` runs it before torch loads
from rlexp.run.warmup import ensure_warm_checkpoint
from rlexp.tracking.files import fingerprint_examples, hash_files
from rlexp.tracking.registry import configured_trackers
from rlexp.transport import check_transport

CHECKS_DONE = "checks done (config, memory plan, data, reward, model files)"


@dataclass
class Prepared:
    """What validation produced."""

    cfg: TrainConfig
    env: Environment
    model_dir: str
    seeds: dict[str, int]
    extra: dict[str, Any]  # manifest entries: determinism flags, dataset and model fingerprints
    benchmarks: dict[str, tuple[Environment, int]]  # eval.benchmarks: name -> (environment, max_tokens)
    # Model verifiers the reward scores with, each given a service of its own, checkpoints resolved.
    served_verifiers: list[VerifierConfig] = field(default_factory=list)
    # The reward builds up state while it scores (Weaver's pool and fit): its service carries it to a respawn.
    reward_stateful: bool = False
    reward_pure: bool = False  # `rlexp.rewards.base.Reward.pure`
    # mesh name -> each rank's GPUs (`rlexp.cluster.layout.assign_gpus`, empty on CPU): decided
    # here once, from the verifiers the reward kept, for the wiring's masks and a respawn alike
    gpus: dict[str, list[str]] = field(default_factory=dict)


# Values `prepare` derives when the composed config leaves them unset
# (`trainer.micro_batch_size=0`, an unset `cluster.threads_per_proc`,
# `generator.gpu_memory_utilization=0` on CUDA): decided once, in the typed config, and copied into
# the record by `recorded`.
DERIVED_KEYS = ("trainer.micro_batch_size", "generator.gpu_memory_utilization",
                "cluster.threads_per_proc")


def recorded(composed: DictConfig, cfg: TrainConfig) -> dict[str, Any]:
    """What the run records as its config (the manifest, the trackers): the composed config as
    given, with the values `prepare` derived (`DERIVED_KEYS`) taken from the typed `cfg`, resolved
    once into plain data (no DictConfig below here). A copy: `composed` itself stays as composed
    (the resume hash is taken of it)."""
    out = copy.deepcopy(composed)
    for key in DERIVED_KEYS:
        OmegaConf.update(out, key, attrgetter(key)(cfg), merge=False)
    # as the manifest resolves a config (`rlexp.tracking.runconfig.config_to_container`)
    plain = OmegaConf.to_container(out, resolve=True, enum_to_str=True, throw_on_missing=False)
    assert isinstance(plain, dict)
    return plain  # type: ignore[return-value]


def check_config(composed: DictConfig) -> TrainConfig:
    """The composed config as the typed schema (`rlexp.config.typed.typed_config`, the one
    conversion), every value checked (`rlexp.config.validate.validate`), the environment's options
    known (`rlexp.envs.base.Environment.Options`) and, for a real model, the memory plan (a
    `trainer.micro_batch_size` of 0 becomes the largest that fits) against this machine's devices:
    the cheap part of `prepare`, so a bad override is refused naming its key in well under a
    second. Values derived here (`DERIVED_KEYS`) are decided once, in the typed
    config; the run's record takes them from it (`recorded`)."""
    check_composed_keys(composed)
    cfg = typed_config(composed)
    # before any name is looked up; a bad one fails here
    activate(list(cfg.plugins), search_paths(cfg.config_path))
    try:
        # the planner and the layout ask the job kind: an unknown one stops here
        job_backend(cfg.cluster.job)
    except ValueError as e:
        raise ConfigError(f"cluster={cfg.cluster.name}: {e}") from None
    # every value first: the planner and the layout below compute with them
    validate(cfg, check_weights=check_model_files)
    real, cuda = cfg.model.flavor != "tiny", cfg.cluster.device == "cuda"
    trainer, generator = cfg.trainer, cfg.generator
    report = plan_memory(cfg) if real or cuda or trainer.micro_batch_size == 0 else None
    if report is not None and trainer.micro_batch_size == 0:  # derived: the largest the plan fits
        trainer.micro_batch_size = report.micro_batch_size
    # derived: vLLM holds the plan
    if report is not None and cuda and not generator.gpu_memory_utilization:
        generator.gpu_memory_utilization = report.gpu_memory_utilization
    # every CUDA run, the tiny model too: the GPUs of the roles this machine hosts, before spawning
    if cuda and (here := controller_gpus(cfg)):
        check_devices(report, cfg.cluster, needed=here)
        # this machine's driver runs torch's CUDA build (rlexp doctor prints the details)
        check_driver()
    check_context(cfg)
    # RAM and processes, before any spawn
    check_host(sizes_of(cfg, job_backend(cfg.cluster.job).one_machine))
    # derived, and recorded: the thread count changes float reductions
    if cfg.cluster.threads_per_proc is None:
        cfg.cluster.threads_per_proc = auto_threads(cfg)
    if cfg.cluster.device == "cuda" and cfg.cluster.gpus_per_host:
        check_hosts_fit(cfg)  # every host's roles fit its GPUs
    check_env_options(cfg.environment)
    # a user's loss: imported and kind-checked here, not in the trainer process
    LOSSES.get(cfg.algorithm.loss)
    configured_trackers(cfg.logger)  # trackers' names and options checked, their modules recorded
    if report is not None and real and not report.ok:
        raise PlanError("the configured layout does not fit:\n" + report.table(), report)
    return cfg


def prepare(composed: DictConfig, phase: Callable[[str], object] | None = None) -> Prepared:
    """Every check that needs no process. Raises `ConfigError`/`PlanError`/`TransportError`/`CheckpointError`.
    `phase` is told when the checks are done, before a `model.warmup` that trains (a phase of its own)."""
    cfg = check_config(composed)
    try:
        check_cluster(cfg.cluster)
    except ValueError as e:
        raise ConfigError(f"cluster={cfg.cluster.name}: {e}") from None
    check_transport(cfg.cluster.transport, hosts=weight_hosts(cfg.cluster), cluster=cfg.cluster)
    processes = {"generator": cfg.generator.replicas, "trainer": cfg.model.parallelism.trainer_world,
                 "reward": cfg.reward.replicas}
    idle = {r: (n, processes[r]) for r, n in cfg.cluster.role_hosts.items() if r in processes and n > processes[r]}
    if idle:
        raise ConfigError("; ".join(f"cluster.hosts_per_role.{r}={n} hosts for {k} process(es) would leave hosts idle: "
                                    f"lower it, or raise the role's replicas" for r, (n, k) in idle.items()))
    inputs = load_inputs(cfg)  # data, benchmarks, reward: `rlexp train` checked them before torch loaded
    env, train, held, benchmarks, reward = (inputs.env, inputs.train, inputs.held, inputs.benchmarks,
                                            inputs.reward)
    served = served_checkpoints(cfg, reward)  # every model the reward scores with
    gpus = assign_gpus(cfg)  # after the reward's verifiers are known: each served one gets GPUs
    check_multi_turn(cfg, env)
    model_dir = str(resolve_model(cfg.model))
    extra_limits = check_checkpoint_limits(cfg, model_dir)
    # both before the warm-up, which trains the same tokenizer's model: the longer-prompt refusal first, as it
    # names the context to fit
    check_prompt_lengths(cfg, env.name, {"train": train, "eval": held}, model_dir)
    vocabulary = check_vocabulary(cfg, train, held, model_dir)
    warm = None
    if cfg.model.warmup.steps:
        if phase is not None:
            phase(CHECKS_DONE)
        warm_dir, warm = ensure_warm_checkpoint(Path(model_dir), cfg, env)
        model_dir = str(warm_dir)
    seeds = component_seeds(cfg.seed, cfg.generator.shards)
    extra = {
        "determinism": apply_determinism(cfg.determinism, cfg.seed),
        "datasets": {f"{cfg.environment.name}/train": {"n": len(train), "sha256": fingerprint_examples(
            [(s.id, s.problem.prompt, s.answer) for s in train])},
            f"{cfg.environment.name}/eval": {"n": len(held), "sha256": fingerprint_examples(
                [(s.id, s.problem.prompt, s.answer) for s in held])}},
        "model": {"name": cfg.model.name, "hf_repo": cfg.model.hf_repo, "revision": cfg.model.revision,
                  "path": model_dir, "sha256": hash_files(model_dir), "warmup": warm,
                  "limits": extra_limits, "vocabulary": vocabulary},
    }
    extra["verifiers"] = {v.name: {"kind": str(v.kind), "path": v.options["path"],
                                   "sha256": hash_files(v.options["path"])} for v in served}
    export_used(cfg.plugins, cfg.config_path)  # the actors import what the lookups above used
    extra["plugins"] = describe_plugins(used_modules(cfg.plugins))  # what `rlexp reproduce` checks before a re-run
    extra["config_path"] = describe_config_dirs(cfg.config_path)
    stateful = type(reward).state_dict is not Reward.state_dict
    # A subclass of a pure reward that keeps state or scores with verifiers is not pure, whatever it inherits.
    pure = type(reward).pure and not stateful and not reward.verifiers
    return Prepared(cfg, env, model_dir, seeds, extra, benchmarks, served, stateful, pure, gpus)


def check_checkpoint_limits(cfg: TrainConfig, model_dir: str) -> list[str]:
    """The checkpoint's own config.json against the run (`rlexp.models.limits`): vocabulary and RoPE
    must match, `model.arch.max_seq_len` (vLLM's max_model_len) is lowered to the checkpoint's
    positions and said. The tiny model's checkpoint is written from `model.arch`, so there is
    nothing to compare. Returns what was changed."""
    if cfg.model.flavor == "tiny" and not cfg.model.path:
        return []
    notes = apply_checkpoint_limits(cfg.model, model_dir, cfg.algorithm.max_prompt_tokens,
                                    cfg.algorithm.max_tokens)
    for note in notes:
        print(f"[rlexp] {note}", file=sys.stderr, flush=True)
    return notes


def resolve_model(model_cfg: ModelConfig) -> Path:
    if model_cfg.flavor == "tiny" and not model_cfg.path:
        return ensure_tiny_checkpoint(model_cfg)
    return Path(check_model_files(model_cfg).path)


def apply_determinism(mode: str, seed: int) -> dict[str, Any]:
    """Set the switches in this process and, through the environment, in every actor process spawned later
    (`CUBLAS_WORKSPACE_CONFIG` must precede CUDA initialisation, so it cannot wait for the actor)."""
    random.seed(seed)
    os.environ[DETERMINISM_ENV] = mode
    if mode == "full":
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    return apply_process_determinism()
