"""From a composed config to a running actor graph, and back down again whatever happens.

Order matters: everything that can be checked without spawning (config values, memory plan, weight
transport pairing, model files, datasets, reward construction) is checked first, so a bad input costs
seconds, not an engine start. Teardown runs in `finally` and on SIGTERM, so no process outlives the run.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.config.validate import validate
from rlexp.envs.base import Environment, build_env
from rlexp.seeding import component_seeds

CHECKPOINTS = "checkpoints"


@dataclass
class Prepared:
    """What validation produced; nothing here holds a process."""

    cfg: Any  # the typed TrainConfig
    env: Environment
    model_dir: str
    seeds: dict[str, int]
    extra: dict[str, Any]
    benchmarks: dict[str, tuple[Environment, int]]  # eval.benchmarks: name -> (environment, max_tokens)


def prepare(cfg: DictConfig) -> Prepared:
    """Every check that needs no process. Raises `ConfigError`/`PlanError`/`TransportError`/`CheckpointError`."""
    from rlexp.models.planner import check_plan
    from rlexp.rewards.registry import build_reward
    from rlexp.tracking.manifest import fingerprint_examples, hash_files
    from rlexp.transport import check_transport

    t = OmegaConf.to_object(cfg)
    validate(t)
    if t.model.flavor != "tiny":
        check_plan(cfg)
    check_transport(t.cluster.transport, hosts=t.cluster.hosts)
    from rlexp.config.validate import ConfigError

    try:
        env = build_env(t.environment)
        train, held = env.train_samples(), env.eval_samples()
        benchmarks = load_benchmarks(list(t.eval.benchmarks))
        build_reward(t.reward, env)  # unknown verifiers, missing RM checkpoints: fail now, not in an actor
    except (ValueError, FileNotFoundError) as e:  # bad environment/reward/benchmark input: one clear line
        raise ConfigError(f"environment={t.environment.name} reward={t.reward.name}: {e}") from e
    if type(env).step is not Environment.step:
        raise ConfigError(f"environment={t.environment.name} is multi-turn (tool calls); the training loop samples "
                          f"single-turn episodes only, so tool output would be trained on as if the policy wrote it. "
                          f"Evaluate it with `rlexp eval`, or train on a single-turn environment")
    model_dir = str(resolve_model(t.model))
    seeds = component_seeds(t.seed, t.generator.replicas)
    extra = {
        "determinism": apply_determinism(t.determinism, t.seed),
        "datasets": {f"{t.environment.name}/train": {"n": len(train), "sha256": fingerprint_examples(
            [(s.id, s.problem.prompt, s.answer) for s in train])},
            f"{t.environment.name}/eval": {"n": len(held), "sha256": fingerprint_examples(
                [(s.id, s.problem.prompt, s.answer) for s in held])}},
        "model": {"name": t.model.name, "hf_repo": t.model.hf_repo, "revision": t.model.revision,
                  "path": model_dir, "sha256": hash_files(model_dir)},
    }
    return Prepared(t, env, model_dir, seeds, extra, benchmarks)


def load_benchmarks(names: list[str]) -> dict[str, tuple[Environment, int]]:
    """Benchmarks evaluated during training, with their data loaded now: missing data fails before spawning."""
    from rlexp.evals.cli import benchmark_envs
    from rlexp.train import CONF_DIR

    out: dict[str, tuple[Environment, int]] = {}
    for name in names:  # read directly: Hydra's compose API cannot run inside the running train app
        path = Path(CONF_DIR) / "benchmark" / f"{name}.yaml"
        if not path.exists():
            from rlexp.config.validate import ConfigError

            choices = sorted(p.stem for p in path.parent.glob("*.yaml"))
            raise ConfigError(f"eval.benchmarks: unknown benchmark {name!r}; choose from {choices}")
        parts = [n for n in OmegaConf.load(path).get("defaults", []) if n != "_self_"] or [name]  # e.g. all.yaml
        bench = OmegaConf.merge(*[OmegaConf.load(path.parent / f"{n}.yaml") for n in parts])
        out.update(benchmark_envs(OmegaConf.create({"benchmark": bench, "max_tokens": None})))
    for env, _ in out.values():
        env.eval_samples()
    return out


def resolve_model(model_cfg: Any) -> Path:
    if model_cfg.flavor == "tiny" and not model_cfg.path:
        from rlexp.models.tiny import ensure_tiny_checkpoint

        return ensure_tiny_checkpoint(model_cfg)
    from rlexp.models.hf import check_model_files

    return Path(check_model_files(model_cfg).path)


def apply_determinism(mode: str, seed: int) -> dict[str, Any]:
    """Set the switches in this process and, through the environment, in every actor process spawned later
    (`CUBLAS_WORKSPACE_CONFIG` must precede CUDA initialisation, so it cannot wait for the actor)."""
    from rlexp.seeding import DETERMINISM_ENV, apply_process_determinism

    random.seed(seed)
    os.environ[DETERMINISM_ENV] = mode
    if mode == "full":
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    return apply_process_determinism()


class Graph:
    """The spawned actor graph plus everything needed to stop it."""

    def __init__(self) -> None:
        self.meshes: list[tuple[str, Any]] = []
        self.placement: list[str] = []
        self.services: Any = None

    def spawn(self, name: str, cls: type, *args: Any, procs: int = 1, mesh: Any = None) -> Any:
        from monarch.actor import this_host

        if mesh is None:
            mesh = this_host().spawn_procs(per_host={"procs": procs})
            self.meshes.append((name, mesh))
        return mesh.spawn(name, cls, *args)

    def mesh(self, name: str) -> Any:
        return dict(self.meshes)[name]

    def stop(self) -> None:
        for name, mesh in reversed(self.meshes):
            try:
                mesh.stop().get(timeout=30)
            except Exception as e:  # noqa: BLE001 - teardown must go on to the next mesh
                print(f"[rlexp] stopping {name}: {e}", file=sys.stderr)
        self.meshes.clear()


def build_graph(p: Prepared, run_name: str) -> Graph:
    from rlexp.actors.buffer import ReplayBuffer
    from rlexp.actors.generator import Generator
    from rlexp.actors.reward import RewardService, judge_names
    from rlexp.actors.trainer import Reference, Trainer
    from rlexp.loop import Services, rank0
    from rlexp.models.tokenizer import load_tokenizer

    c = p.cfg
    g = Graph()
    pad_id = load_tokenizer(p.model_dir).pad_id
    gpus = assign_gpus(c)
    gen_opts = {"device": c.cluster.device} if c.generator.backend == "titan" else {
        "tp": c.generator.tp, "kv_cache_gb": c.generator.kv_cache_gb,
        "gpu_memory_utilization": c.generator.gpu_memory_utilization, "enforce_eager": c.generator.enforce_eager,
        "max_num_seqs": c.generator.max_num_seqs, "max_num_batched_tokens": c.generator.max_num_batched_tokens,
        "device": c.cluster.device}
    gens = [g.spawn(f"generator{i}", Generator, c.model, p.model_dir, c.generator.backend,
                    p.seeds[f"generator/{i}"], c.cluster.threads_per_proc, gen_opts, gpus.get(f"generator{i}", [None])[0])
            for i in range(c.generator.replicas)]
    # The trainer is one proc, or one proc per (FSDP x TP) rank (one GPU each on CUDA); see rlexp/actors/trainer.py.
    world, tp = trainer_world_size(c), c.model.parallelism.trainer_tp
    port = free_port() if world > 1 else 0
    trainer = g.spawn("trainer", Trainer, c.model, p.model_dir, c.trainer, c.algorithm, c.steps, p.seeds["trainer"],
                      pad_id, c.cluster.transport, run_name, c.cluster.threads_per_proc, c.cluster.shm_dir,
                      world, port, c.cluster.device, tp, gpus.get("trainer"), procs=world)
    # The reference model shares the trainer's processes (and GPUs), sharded the same way.
    reference = (g.spawn("reference", Reference, c.model, p.model_dir, pad_id, c.cluster.threads_per_proc, world, port,
                         c.cluster.device, tp, gpus.get("trainer"), c.trainer.mixed_precision, mesh=g.mesh("trainer"))
                 if c.algorithm.kl_coef > 0 else None)
    reward = g.spawn("reward", RewardService, c.reward, c.environment, procs=c.reward.replicas)
    # The buffer is light: it shares the first reward process instead of paying for a process of its own.
    buffer = g.spawn("buffer", ReplayBuffer, p.seeds["buffer"], c.sync.max_policy_age if c.sync.mode == "async" else 0,
                     mesh=g.meshes[-1][1].slice(procs=0))
    setup = [m.setup.call_one() for m in gens] + [trainer.setup.call()]  # every trainer rank sets up
    times = [f.get() for f in setup]
    n_params = rank0(times[-1])
    if reference is not None:  # after the trainer: it joins the trainer's process group
        reference.setup.call().get()
    rewards = [reward.slice(procs=i) for i in range(c.reward.replicas)]
    if judge_names(c.reward):  # LM judges are served by the generators
        for i, r in enumerate(rewards):
            r.attach_judges.call_one(gens[i % len(gens)], p.model_dir).get()
    g.services = Services(generators=gens, trainer=trainer, rewards=rewards, buffer=buffer, reference=reference)
    g.placement = describe_placement(g, c, n_params, times[:-1])
    return g


def trainer_world_size(c: Any) -> int:
    return c.model.parallelism.trainer_fsdp * c.model.parallelism.trainer_tp


def generator_gpus(c: Any) -> int:
    """GPUs per generator replica: vLLM's tensor parallel degree; the titan backend uses one."""
    return c.generator.tp if c.generator.backend == "vllm" else 1


def assign_gpus(c: Any) -> dict[str, list[str]]:
    """CUDA_VISIBLE_DEVICES per role and rank on this host: the trainer's ranks (and the reference
    model beside them) take GPUs 0..W-1, then each generator replica takes `generator.tp` GPUs. Without
    it every process would open GPU 0. Empty on CPU. Fits are checked by `validate`."""
    if c.cluster.device != "cuda":
        return {}
    world, tp = trainer_world_size(c), generator_gpus(c)
    out = {"trainer": [str(r) for r in range(world)]}
    for i in range(c.generator.replicas):
        first = world + i * tp
        out[f"generator{i}"] = [",".join(str(first + j) for j in range(tp))]
    return out


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the trainer's process group rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_placement(g: Graph, c: Any, n_params: int, gen_setup_s: list[float]) -> list[str]:
    lines = [f"actor graph ({c.cluster.name}, {c.cluster.device}, {c.cluster.hosts} host):"]
    gpus = assign_gpus(c)
    for name, mesh in g.meshes:
        role = {"generator": f"{c.generator.backend} backend, engine ready in {{:.1f}}s",
                "trainer": f"TorchTitan Qwen3 {n_params/1e6:.2f}M params, AdamW lr={c.trainer.lr}"
                           + (f", {trainer_world_size(c)} ranks (FSDP2 {c.model.parallelism.trainer_fsdp} x TP "
                              f"{c.model.parallelism.trainer_tp})" if trainer_world_size(c) > 1 else "")
                           + (", activation checkpointing" if c.trainer.activation_checkpointing else "")
                           + (", bf16 mixed precision" if c.trainer.mixed_precision else "")
                           + ("; reference model (frozen initial policy, KL) on the same procs"
                              if c.algorithm.kl_coef > 0 else ""),
                "reward": f"reward={c.reward.name} verifiers; replay buffer (max_policy_age="
                          f"{c.sync.max_policy_age if c.sync.mode == 'async' else 0}) on its first proc",
                }
        key = next(k for k in role if name.startswith(k))
        desc = role[key]
        if key == "generator":
            desc = desc.format(gen_setup_s[int(name.removeprefix("generator") or 0)])
        where = f"GPUs {'|'.join(gpus[name])}" if name in gpus else "this host"
        lines.append(f"  {name:<11} proc mesh {dict(mesh.extent)} on {where}: {desc}")
    lines.append("  controller  this process: GRPO loop (rlexp/loop.py), data order, evaluation, checkpoints")
    return lines


def run(cfg: DictConfig) -> dict[str, float]:
    """`rlexp train` body: validate, spawn, train, evaluate, checkpoint, tear down. Returns final metrics."""
    from hydra.core.hydra_config import HydraConfig

    from rlexp.tracking.base import build_trackers, truncate_metrics
    from rlexp.tracking.manifest import write_start_manifest

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    p = prepare(cfg)
    resume_from = find_resume(p.cfg, run_dir)
    if resume_from is not None:
        check_resume_config(resume_from, cfg)
        truncate_metrics(run_dir, read_ckpt_step(resume_from))
    manifest = write_start_manifest(run_dir, cfg, sys.argv, p.seeds, {**p.extra, "resumed_from": str(resume_from) if resume_from else None})
    run_name = f"{run_dir.name}-{os.getpid()}"
    release_stale_weights(p.cfg)
    interrupts = Interrupts()
    previous = {sig: signal.signal(sig, interrupts.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    graph: Graph | None = None
    try:
        with build_trackers(cfg.logger, cfg, run_dir, manifest) as trackers:
            graph = build_graph(p, run_name)
            print("\n".join(graph.placement), flush=True)
            from rlexp.controller import Controller

            ctl = Controller(p, graph.services, run_dir, trackers, resume_hash(cfg), between_steps=interrupts.check)
            interrupts.deferred = True
            final = ctl.run(resume_from)
            trackers.final_metrics.update(final)
            return final
    finally:
        interrupts.deferred = False
        if graph is not None:
            graph.stop()
        release_weights(p.cfg, run_name)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def release_stale_weights(c: Any) -> None:
    """Remove weights published by runs that died without tearing down (kill -9, OOM): folder names end in
    the controller's pid, so a folder whose process is gone belongs to nobody."""
    import shutil

    root = Path(c.cluster.shm_dir)
    if c.cluster.transport != "shm" or not root.is_dir():
        return
    for d in root.iterdir():
        pid = d.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def release_weights(c: Any, run_name: str) -> None:
    """Remove the run's published weights (RAM-backed /dev/shm), also when the trainer died first."""
    import shutil

    if c.cluster.transport == "shm":
        shutil.rmtree(Path(c.cluster.shm_dir) / run_name, ignore_errors=True)


class Interrupts:
    """Ctrl-C (SIGINT) and SIGTERM. From the first evaluation to the last step, the first signal stops the
    run at the end of the current step, where no actor call is half-done: an exception raised inside
    Monarch's waiting code could leave teardown hanging. A second signal, or one during start-up or the
    final evaluation and export, stops at once. SIGINT ends as KeyboardInterrupt, SIGTERM as exit code
    143; both mark the run interrupted."""

    def __init__(self) -> None:
        self.deferred = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: Any) -> None:
        if not self.deferred or self.pending is not None:
            raise self._exception(signum)
        self.pending = signum
        print(f"\n[rlexp] {signal.Signals(signum).name}: stopping after this step (send it again to stop now)",
              file=sys.stderr, flush=True)

    def check(self, final: bool = False) -> None:
        if final:
            self.deferred = False
        if self.pending is not None:
            signum, self.pending, self.deferred = self.pending, None, False
            raise self._exception(signum)

    @staticmethod
    def _exception(signum: int) -> BaseException:
        return KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(143)


def find_resume(c: Any, run_dir: Path) -> Path | None:
    if c.resume == "never":
        return None
    root = run_dir if c.resume == "auto" else Path(c.resume)
    if (root / "controller.pt").exists():
        return root
    ckpts = sorted((root / CHECKPOINTS).glob("step_*")) if (root / CHECKPOINTS).exists() else []
    ckpts = [d for d in ckpts if (d / "COMPLETE").exists()]
    if ckpts:
        return ckpts[-1]
    if c.resume == "auto":
        return None
    from rlexp.config.validate import ConfigError

    raise ConfigError(f"resume={c.resume}: no complete checkpoint there (expected {root}/checkpoints/step_*/COMPLETE); "
                      f"use resume=auto in the run's folder (hydra.run.dir=RUN_DIR) or resume=never")


def read_ckpt_step(ckpt: Path) -> int:
    return int(json.loads((ckpt / "meta.json").read_text())["step"])


def check_resume_config(ckpt: Path, cfg: DictConfig) -> None:
    from rlexp.config.validate import ConfigError

    meta = json.loads((ckpt / "meta.json").read_text())
    now = resume_hash(cfg)
    if meta["resume_hash"] != now and not cfg.force_resume:
        raise ConfigError(f"refusing to resume from {ckpt}: the config differs from the one that wrote it "
                          f"(hash {meta['resume_hash'][:12]} vs {now[:12]}); rerun with the original overrides, "
                          f"or add force_resume=true to continue under the new config")


def resume_hash(cfg: DictConfig) -> str:
    """Hash of the config minus keys that may legitimately change across a resume."""
    from rlexp.tracking.manifest import config_hash

    c = OmegaConf.to_container(cfg, resolve=True)
    for k in ("resume", "force_resume", "steps"):
        c.pop(k, None)
    return config_hash(c)
