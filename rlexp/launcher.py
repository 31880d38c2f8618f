"""`rlexp train`: from a composed config to a running actor graph, and back down again whatever happens.

`prepare` checks everything that needs no process first; then the graph is spawned, the controller
runs the loop, and teardown runs in `finally` and on SIGTERM, so no process outlives the run.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from monarch.actor import this_host
from omegaconf import DictConfig

from rlexp import checkpoints
from rlexp.actors.buffer import ReplayBuffer
from rlexp.actors.generator import Generator
from rlexp.actors.reward import RewardService
from rlexp.actors.trainer import Reference, Trainer
from rlexp.actors.verifier import VerifierService
from rlexp.config.layout import assign_gpus
from rlexp.controller import Controller
from rlexp.models.tokenizer import load_tokenizer
from rlexp.prepare import Prepared, prepare
from rlexp.services import Collective, Service, Services
from rlexp.tracking.manifest import write_start_manifest
from rlexp.tracking.registry import build_trackers
from rlexp.transport.monarch import WeightServer
from rlexp.transport.registry import pair_transports


class Graph:
    """The spawned actor graph plus everything needed to stop it."""

    def __init__(self) -> None:
        self.meshes: list[tuple[str, Any]] = []
        self.placement: list[str] = []
        self.services: Services | None = None
        self.transports: list[str] = []  # per generator replica: how its weights arrive
        self.weight_server: Any = None  # monarch transport: what a (re)spawned generator connects to

    def spawn(self, name: str, cls: type, *args: Any, procs: int = 1, mesh: Any = None) -> Any:
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
            except Exception as e:  # teardown must go on to the next mesh
                print(f"[rlexp] stopping {name}: {e}", file=sys.stderr)
        self.meshes.clear()


def build_graph(p: Prepared, run_name: str, *, trainer_host: str | None = None,
                generator_hosts: list[str] | None = None) -> Graph:
    """Spawn every role on this host and wire them into `Services`. `trainer_host`/`generator_hosts` (one per
    replica) name where the roles live, which picks each trainer->generator weight transport
    (`pair_transport`); both default to this host."""
    c = p.cfg
    g = Graph()
    here = socket.gethostname()
    if generator_hosts is not None and len(generator_hosts) != c.generator.replicas:
        raise ValueError(f"build_graph: {len(generator_hosts)} generator hosts for {c.generator.replicas} replicas")
    gen_transports = g.transports = pair_transports(c.cluster.transport, trainer_host or here,
                                                    generator_hosts or [here] * c.generator.replicas)
    pad_id = load_tokenizer(p.model_dir).pad_id
    gpus = assign_gpus(c)
    gen_opts = {"device": c.cluster.device} if c.generator.backend == "titan" else {
        "tp": c.generator.tp, "kv_cache_gb": c.generator.kv_cache_gb,
        "gpu_memory_utilization": c.generator.gpu_memory_utilization, "enforce_eager": c.generator.enforce_eager,
        "max_num_seqs": c.generator.max_num_seqs, "max_num_batched_tokens": c.generator.max_num_batched_tokens,
        "device": c.cluster.device}
    gen_seeds = tuple(p.seeds[f"generator/{i}"] for i in range(c.generator.replicas))
    gens = [g.spawn(f"generator{i}", Generator, c.model, p.model_dir, c.generator.backend, gen_seeds[i],
                    c.cluster.threads_per_proc, gen_opts, gpus.get(f"generator{i}", [None])[0], gen_transports[i])
            for i in range(c.generator.replicas)]
    # The trainer is one proc, or one proc per (FSDP x TP) rank (one GPU each on CUDA); see rlexp/actors/trainer.py.
    world, tp = c.model.parallelism.trainer_world, c.model.parallelism.trainer_tp
    port = free_port() if world > 1 else 0
    trainer = g.spawn("trainer", Trainer, c.model, p.model_dir, c.trainer, c.algorithm, c.steps, p.seeds["trainer"],
                      pad_id, gen_transports, run_name, c.cluster.threads_per_proc, c.cluster.shm_dir,
                      world, port, c.cluster.device, tp, gpus.get("trainer"), c.cluster.transport_chunk_mb * 2**20,
                      procs=world)
    if "monarch" in gen_transports:  # serves versions from the trainer's first process, apart from its mailbox
        g.weight_server = g.spawn("weights", WeightServer, mesh=g.mesh("trainer").slice(procs=0))
        for gen, t in zip(gens, gen_transports):
            if t == "monarch":
                gen.connect_weights.call_one(g.weight_server).get()
    # The reference model shares the trainer's processes (and GPUs), sharded the same way.
    reference = (g.spawn("reference", Reference, c.model, p.model_dir, pad_id, c.cluster.threads_per_proc, world, port,
                         c.cluster.device, tp, gpus.get("trainer"), c.trainer.mixed_precision, mesh=g.mesh("trainer"))
                 if c.algorithm.kl_coef > 0 else None)
    # Each model verifier gets processes of its own: scaled and placed apart from the policy and the reward.
    verifiers = {v.name: g.spawn(f"verifier_{v.name}", VerifierService, v, c.environment, c.cluster.threads_per_proc,
                                 c.cluster.device, gpus.get(f"verifier_{v.name}"), procs=v.replicas)
                 for v in p.served_verifiers}
    reward = g.spawn("reward", RewardService, c.reward, c.environment, procs=c.reward.replicas)
    # The buffer is light: it shares the first reward process instead of paying for a process of its own.
    buffer = g.spawn("buffer", ReplayBuffer, p.seeds["buffer"], c.sync.policy_age, mesh=g.meshes[-1][1].slice(procs=0))
    verifier_setup = {name: m.setup.call() for name, m in verifiers.items()}  # load while the policy loads
    setup = [m.setup.call_one() for m in gens] + [trainer.setup.call()]  # every trainer rank sets up
    times = [f.get() for f in setup]
    n_params = next(iter(times[-1].values()))  # rank 0's answer
    verifier_s = {name: max(f.get().values()) for name, f in verifier_setup.items()}
    if reference is not None:  # after the trainer: it joins the trainer's process group
        reference.setup.call().get()
    rewards = [reward.slice(procs=i) for i in range(c.reward.replicas)]
    replicas = {v.name: [verifiers[v.name].slice(procs=j) for j in range(v.replicas)] for v in p.served_verifiers}
    for i, r in enumerate(rewards):
        r.attach_verifiers.call_one(replicas).get()
        r.attach_judges.call_one(gens[i % len(gens)], p.model_dir).get()  # judges that are the policy itself
    g.services = Services(generators=Service("generators", gens), trainer=Collective("trainer", trainer),
                          rewards=Service("rewards", rewards), buffer=Service("buffer", [buffer]),
                          reference=Collective("reference", reference) if reference is not None else None,
                          generator_seeds=gen_seeds)
    g.placement = describe_placement(g, c, n_params, times[:-1], p, verifier_s)
    return g


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the trainer's process group rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_placement(g: Graph, c: Any, n_params: int, gen_setup_s: list[float], p: Prepared,
                       verifier_s: dict[str, float]) -> list[str]:
    lines = [f"actor graph ({c.cluster.name}, {c.cluster.device}, {c.cluster.hosts} host):"]
    gpus = assign_gpus(c)
    par = c.model.parallelism
    for name, mesh in g.meshes:
        role = {"generator": f"{c.generator.backend} backend, engine ready in {{:.1f}}s",
                "trainer": f"TorchTitan Qwen3 {n_params/1e6:.2f}M params, AdamW lr={c.trainer.lr}"
                           + (f", {par.trainer_world} ranks (FSDP2 {par.trainer_fsdp} x TP {par.trainer_tp})"
                              if par.trainer_world > 1 else "")
                           + (", activation checkpointing" if c.trainer.activation_checkpointing else "")
                           + (", bf16 mixed precision" if c.trainer.mixed_precision else "")
                           + ("; reference model (frozen initial policy, KL) on the same procs"
                              if c.algorithm.kl_coef > 0 else ""),
                "reward": f"reward={c.reward.name}"
                          + (f" over {len(c.reward.verifiers)} verifiers" if c.reward.verifiers else "")
                          + f"; replay buffer (max_policy_age={c.sync.policy_age}) on its first proc",
                "verifier": "",
                }
        key = next(k for k in role if name.startswith(k))
        desc = role[key]
        if key == "generator":
            desc = desc.format(gen_setup_s[int(name.removeprefix("generator") or 0)])
        if key == "verifier":
            v = next(v for v in p.served_verifiers if f"verifier_{v.name}" == name)
            desc = f"{v.kind} {v.options.get('path')}, ready in {verifier_s[v.name]:.1f}s"
        where = f"GPUs {'|'.join(gpus[name])}" if name in gpus else "this host"
        lines.append(f"  {name:<11} proc mesh {dict(mesh.extent)} on {where}: {desc}")
    lines.append(f"  weights     trainer -> generators by {', '.join(g.transports)} (cluster.transport="
                 f"{c.cluster.transport})")
    lines.append("  controller  this process: GRPO loop (rlexp/loop.py), data order, evaluation, checkpoints")
    return lines


def run(cfg: DictConfig) -> dict[str, float]:
    """`rlexp train` body: validate, spawn, train, evaluate, checkpoint, tear down. Returns final metrics."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    p = prepare(cfg)
    resume_from = checkpoints.find_resume(p.cfg.resume, run_dir)
    cfg_hash = checkpoints.resume_hash(cfg)
    if resume_from is not None:
        checkpoints.check_resumable(resume_from)
        checkpoints.check_resume_config(resume_from, cfg_hash, p.cfg.force_resume)
        checkpoints.truncate_metrics(run_dir, checkpoints.read_meta(resume_from)["step"])
    manifest = write_start_manifest(run_dir, cfg, sys.argv, p.seeds,
                                    {**p.extra, "resumed_from": str(resume_from) if resume_from else None})
    run_name = f"{run_dir.name}-{os.getpid()}"
    release_stale_weights(p.cfg)
    interrupts = Interrupts()
    previous = {sig: signal.signal(sig, interrupts.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    graph: Graph | None = None
    try:
        with build_trackers(cfg.logger, cfg, run_dir, manifest) as trackers:
            graph = build_graph(p, run_name)
            print("\n".join(graph.placement), flush=True)
            assert graph.services is not None
            ctl = Controller(p, graph.services, run_dir, trackers, cfg_hash, between_steps=interrupts.check)
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
    root = Path(c.cluster.shm_dir)
    if c.cluster.transport not in ("shm", "auto") or not root.is_dir():
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
    if c.cluster.transport in ("shm", "auto"):
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
