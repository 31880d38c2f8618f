"""`rlexp train`: from a composed config to a running actor graph, and back down again whatever happens.

`prepare` checks everything that needs no process first; then the graph is spawned, the controller
runs the loop, and teardown runs in `finally` and on SIGTERM, so no process outlives the run.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import monarch.actor
from hydra.core.hydra_config import HydraConfig
from monarch._src.actor import config as monarch_config  # the switch has no public home in Monarch 0.7
from omegaconf import DictConfig

from rlexp import checkpoints
from rlexp.actors.buffer import ReplayBuffer
from rlexp.actors.generator import Generator
from rlexp.actors.probe import Probe
from rlexp.actors.reward import RewardService
from rlexp.actors.trainer import Reference, Trainer
from rlexp.actors.verifier import VerifierService
from rlexp.cluster.hosts import LOCAL, ROLES, Host, Hosts
from rlexp.cluster.layout import assign_gpus
from rlexp.cluster.registry import job_backend
from rlexp.controller import Controller
from rlexp.errors import RunStopped
from rlexp.models.tokenizer import load_tokenizer
from rlexp.phases import Phases
from rlexp.prepare import Prepared, prepare
from rlexp.services import Collective, Local, Service, ServiceDown, Services, is_process_failure
from rlexp.tracking import runlog
from rlexp.tracking.manifest import read_manifest, write_start_manifest
from rlexp.tracking.registry import build_trackers
from rlexp.transport.registry import pair_transports, resolve, transport_spec


def role_of(name: str) -> str:
    """"generator1" -> "generator", "verifier_rm" -> "verifier": the role whose hosts a mesh runs on."""
    return next(r for r in ROLES if name.startswith(r))


class Graph:
    """The spawned actor graph, where each piece runs, and everything needed to stop it."""

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.meshes: dict[str, tuple[Any, Host]] = {}  # name -> (proc mesh, host)
        self.where: dict[str, list[dict[str, Any]]] = {}  # name -> per process: pid, hostname, host label
        self.placement: list[str] = []
        self.services: Services | None = None
        self.add_generator: Callable[[], None] | None = None  # set by build_graph
        self.transports: list[str] = []  # per generator replica: how its weights arrive
        self.weight_servers: dict[str, Any] = {}  # transport -> its server actor (monarch's)

    def spawn(self, name: str, cls: type, *args: Any, procs: int = 1, host: Host | None = None,
              mesh: Any = None) -> Any:
        """`cls` on a new proc mesh of `procs` processes on `host` (default: the role's first host), or on
        `mesh` when it shares another actor's processes."""
        return (mesh if mesh is not None else self.procs(name, procs, host)).spawn(name, cls, *args)

    def procs(self, name: str, procs: int = 1, host: Host | None = None) -> Any:
        """A new proc mesh for `name`, `procs` processes per host, and where each of them runs."""
        host = host or self.hosts.host(role_of(name))
        mesh = host.mesh.spawn_procs(per_host={"procs": procs})
        self.meshes[name] = (mesh, host)
        self.where[name] = list(mesh.spawn("probe", Probe).where.call().get().values())
        return mesh

    def mesh(self, name: str) -> Any:
        return self.meshes[name][0]

    def drop(self, name: str) -> Host:
        """Stop `name`'s processes (after one died: Monarch may still report the stop as failed); returns its host."""
        mesh, host = self.meshes.pop(name)
        self.where.pop(name, None)
        with contextlib.suppress(Exception):
            mesh.stop().get(timeout=10)
        return host

    def respawn(self, name: str, cls: type, *args: Any, procs: int = 1) -> Any:
        """A new process for `name` on the same host, after its old one died."""
        return self.spawn(name, cls, *args, procs=procs, host=self.drop(name))

    def write_placement(self, path: Path) -> None:
        """Where every role's processes run (name -> host label, hostname, pid), rewritten after a respawn."""
        data = {name: [{**w, "host": self.meshes[name][1].label} for w in where] for name, where in self.where.items()}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, path)

    def stop(self) -> None:
        for name, (mesh, _) in reversed(list(self.meshes.items())):
            try:
                mesh.stop().get(timeout=30)
            except Exception as e:  # teardown must go on to the next mesh
                print(f"[rlexp] stopping {name}: {e}", file=sys.stderr)
        self.meshes.clear()
        self.hosts.close()


def build_graph(p: Prepared, run_name: str, g: Graph | None = None, run_dir: Path | None = None,
                phase: Callable[[str], object] | None = None) -> Graph:
    """Spawn every role on its hosts (into `g`, so a failure half-way still stops what started) and wire them
    into `Services`, with a respawn for each replica. Each trainer->generator pair gets its weight transport
    from the hosts they turned out to run on (`pair_transports`: shm on one machine, monarch across). `phase`
    is told when the processes are up and as each role has loaded its weights: the long waits of start-up."""
    c = p.cfg
    g = g if g is not None else Graph(Hosts(c.cluster))
    hosts = g.hosts
    pad_id = load_tokenizer(p.model_dir).pad_id
    gpus = assign_gpus(c)
    titan_opts = {"device": c.cluster.device, "ignore_eos": c.generator.ignore_eos}
    gen_opts = titan_opts if c.generator.backend == "titan" else {
        "tp": c.generator.tp, "kv_cache_gb": c.generator.kv_cache_gb,
        "gpu_memory_utilization": c.generator.gpu_memory_utilization, "enforce_eager": c.generator.enforce_eager,
        "max_num_seqs": c.generator.max_num_seqs, "max_num_batched_tokens": c.generator.max_num_batched_tokens,
        "device": c.cluster.device, "ignore_eos": c.generator.ignore_eos}
    gen_seeds = tuple(p.seeds[f"generator/{i}"] for i in range(c.generator.shards))
    # The trainer's processes first: the machine they run on decides each generator's weight transport.
    world, tp = c.model.parallelism.trainer_world, c.model.parallelism.trainer_tp
    trainer_mesh = g.procs("trainer", world // len(hosts.roles["trainer"]), hosts.whole("trainer"))
    trainer_machine = g.where["trainer"][0]["hostname"]

    def transport_for(name: str) -> str:
        return pair_transports(c.cluster.transport, trainer_machine, [g.where[name][0]["hostname"]], c)[0]

    def gen_args(i: int) -> tuple[Any, ...]:
        return (c.model, p.model_dir, c.generator.backend, gen_seeds[i % len(gen_seeds)], c.cluster.threads_per_proc,
                gen_opts, gpus.get(f"generator{i}", [None])[0],
                transport_spec(transport_for(f"generator{i}"), run_name, c))

    def connect(gen: Any, i: int) -> Any:
        server = g.weight_servers.get(transport_for(f"generator{i}"))
        if server is not None:
            gen.connect_weights.call_one(server).get()
        return gen

    def new_generator(i: int) -> Any:
        """Generator replica i on its host (a respawn or an added replica), set up and connected to the weights;
        the generators service then gives it the current version before it serves."""
        g.procs(f"generator{i}", 1, hosts.host("generator", i))
        needed = transport_for(f"generator{i}")
        if needed not in g.transports:
            raise RuntimeError(f"generator{i} would need the {needed} weight transport, which this run's trainer "
                               f"does not publish ({sorted(set(g.transports))})")
        gen = g.spawn(f"generator{i}", Generator, *gen_args(i), mesh=g.mesh(f"generator{i}"))
        gen.setup.call_one().get()
        return connect(gen, i)

    gen_meshes = [g.procs(f"generator{i}", 1, hosts.host("generator", i)) for i in range(c.generator.replicas)]
    g.transports = [transport_for(f"generator{i}") for i in range(c.generator.replicas)]
    gens = [g.spawn(f"generator{i}", Generator, *gen_args(i), mesh=gen_meshes[i])
            for i in range(c.generator.replicas)]
    # The trainer is one proc, or one proc per (FSDP x TP) rank (one GPU each on CUDA), `world / hosts` ranks on
    # each host when it spans hosts; rank 0's host holds the rendezvous. See rlexp/actors/trainer.py.
    port: int | str = 0
    if world > 1:
        port = free_port()
        if job_backend(c.cluster.job).remote_rendezvous and c.cluster.role_hosts.get("trainer"):
            rank0 = first_proc(trainer_mesh).spawn("port_probe", Probe)
            port = f"{trainer_machine}:{rank0.free_port.call_one().get()}"
    trainer = g.spawn("trainer", Trainer, c.model, p.model_dir, c.trainer, c.algorithm, c.steps, p.seeds["trainer"],
                      pad_id, [transport_spec(t, run_name, c) for t in dict.fromkeys(g.transports)],
                      c.cluster.threads_per_proc, world, port, c.cluster.device, tp, gpus.get("trainer"),
                      mesh=trainer_mesh)
    for t in dict.fromkeys(g.transports):  # e.g. monarch's: serves versions from the trainer's first process
        server = resolve(t).server
        if server is not None:
            g.weight_servers[t] = g.spawn("weights" if t == "monarch" else f"weights_{t}", server,
                                          mesh=first_proc(trainer_mesh))
    if g.weight_servers:
        for i, gen in enumerate(gens):
            connect(gen, i)
    # The reference model shares the trainer's processes (and GPUs), sharded the same way.
    reference = (g.spawn("reference", Reference, c.model, p.model_dir, pad_id, c.cluster.threads_per_proc, world, port,
                         c.cluster.device, tp, gpus.get("trainer"), c.trainer.mixed_precision, mesh=g.mesh("trainer"))
                 if c.algorithm.kl_coef > 0 else None)
    # The replay buffer is light state saved in checkpoints, read and written every step: it lives in the controller
    # (a `Local`), where a step's episodes cost no message each way, and whose death ends the run anyway.
    buffer = Local(ReplayBuffer, p.seeds["buffer"], c.sync.policy_age)
    # Each model verifier gets processes of its own: scaled and placed apart from the policy and the reward.
    verifiers = {v.name: g.spawn(f"verifier_{v.name}", VerifierService, v, c.environment, c.cluster.threads_per_proc,
                                 c.cluster.device, gpus.get(f"verifier_{v.name}"), procs=v.replicas,
                                 host=hosts.host("verifier", k))
                 for k, v in enumerate(p.served_verifiers)}
    rewards = [g.spawn(f"reward{i}", RewardService, c.reward, c.environment, host=hosts.host("reward", i))
               for i in range(c.reward.replicas)]
    if phase is not None:
        procs = sum(len(w) for w in g.where.values())
        phase(f"processes spawned ({procs} in {len(g.meshes)} meshes: {', '.join(g.meshes)})")
    verifier_setup = {name: m.setup.call() for name, m in verifiers.items()}  # load while the policy loads
    setup = [m.setup.call_one() for m in gens] + [trainer.setup.call()]  # every trainer rank sets up
    times: list[Any] = []
    verifier_s: dict[str, float] = {}
    for name, f in zip([*(f"generator{i}" for i in range(len(gens))), "trainer"], setup):
        times.append(f.get())
        if phase is not None:  # each role as it is ready: many verifiers can take minutes on a loaded CPU
            phase(f"{name} ready")
    n_params = next(iter(times[-1].values()))  # rank 0's answer
    for name, f in verifier_setup.items():
        verifier_s[name] = max(f.get().values())
        if phase is not None:
            phase(f"verifier_{name} ready")
    if reference is not None:  # after the trainer: it joins the trainer's process group
        reference.setup.call().get()
    replicas = {v.name: [verifiers[v.name].slice(procs=j) for j in range(v.replicas)] for v in p.served_verifiers}

    def attach(i: int, r: Any) -> Any:
        r.attach_verifiers.call_one(replicas).get()
        r.attach_judges.call_one(gens[i % len(gens)], p.model_dir).get()  # judges that are the policy itself
        return r

    for i, r in enumerate(rewards):
        attach(i, r)
    def log(msg: str) -> None:
        runlog.announce(f"[rlexp] {msg}")

    placement = (run_dir / "placement.json") if run_dir is not None else None

    def respawned(handle: Any) -> Any:
        if placement is not None:
            g.write_placement(placement)
        return handle

    def respawn_generator(i: int, error: BaseException) -> Any:
        if not c.cluster.fault.respawn:
            return None
        g.drop(f"generator{i}")
        return respawned(new_generator(i))  # the service replays the current weights version into it first

    def respawn_reward(i: int, error: BaseException) -> Any:
        if not c.cluster.fault.respawn:
            return None
        return respawned(attach(i, g.respawn(f"reward{i}", RewardService, c.reward, c.environment)))

    def add_generator() -> None:
        """One more generator replica (elastic): a new process on the role's next host, given the current weights
        by the service before it serves."""
        i = len(g.services.generators.replicas)
        gen = new_generator(i)
        g.services.generators.add_replica(gen, f"generator{i}@{g.meshes[f'generator{i}'][1].label}")
        respawned(gen)

    g.add_generator = add_generator
    fault = c.cluster.fault
    g.services = Services(
        generators=Service("generators", gens, shards=len(gen_seeds), recover=respawn_generator,
                           max_restarts=fault.max_restarts, sticky=("update_weights",), log=log,
                           labels=[f"generator{i}@{g.meshes[f'generator{i}'][1].label}" for i in range(len(gens))]),
        trainer=Collective("trainer", trainer),
        rewards=Service("rewards", rewards, recover=respawn_reward, max_restarts=fault.max_restarts, log=log,
                        labels=[f"reward{i}@{g.meshes[f'reward{i}'][1].label}" for i in range(len(rewards))]),
        buffer=Service("buffer", [buffer]),
        reference=Collective("reference", reference) if reference is not None else None,
        generator_seeds=gen_seeds)
    if placement is not None:
        g.write_placement(placement)
    g.placement = describe_placement(g, c, n_params, times[:-1], p, verifier_s)
    return g


def first_proc(mesh: Any) -> Any:
    """Rank 0's process of a proc mesh, whatever its dimensions ({procs} here, {hosts, procs} across hosts)."""
    return mesh.slice(**dict.fromkeys(dict(mesh.extent), 0))


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the trainer's process group rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def describe_placement(g: Graph, c: Any, n_params: int, gen_setup_s: list[float], p: Prepared,
                       verifier_s: dict[str, float]) -> list[str]:
    n_hosts = len({h.label for hosts in g.hosts.roles.values() for h in hosts} | {LOCAL})
    job = job_backend(c.cluster.job).describe(c.cluster)
    lines = [f"actor graph (cluster={c.cluster.name}: {job}, {c.cluster.device}, "
             f"{n_hosts} host{'s' if n_hosts > 1 else ''} with the controller's):"]
    gpus = assign_gpus(c)
    par = c.model.parallelism
    for name, (mesh, host) in g.meshes.items():
        role = {"generator": f"{c.generator.backend} backend, engine ready in {{:.1f}}s",
                "trainer": f"TorchTitan Qwen3 {n_params/1e6:.2f}M params, AdamW lr={c.trainer.lr}"
                           + (f", {par.trainer_world} ranks (FSDP2 {par.trainer_fsdp} x TP {par.trainer_tp})"
                              if par.trainer_world > 1 else "")
                           + (", activation checkpointing" if c.trainer.activation_checkpointing else "")
                           + (", bf16 mixed precision" if c.trainer.mixed_precision else "")
                           + ("; reference model (frozen initial policy, KL) on the same procs"
                              if c.algorithm.kl_coef > 0 else ""),
                "reward": f"reward={c.reward.name}"
                          + (f" over {len(c.reward.verifiers)} verifiers" if c.reward.verifiers else ""),
                "verifier": "",
                }
        key = role_of(name)
        desc = role[key]
        if key == "generator":
            desc = desc.format(gen_setup_s[int(name.removeprefix("generator") or 0)])
        if key == "verifier":
            v = next(v for v in p.served_verifiers if f"verifier_{v.name}" == name)
            desc = f"{v.kind} {v.options.get('path')}, ready in {verifier_s[v.name]:.1f}s"
        where = g.where.get(name, [])
        hostname = where[0]["hostname"] if where else "?"
        pids = ",".join(str(w["pid"]) for w in where)
        on = f"host {host.label} ({hostname}), pid {pids}"
        if name in gpus:
            on += f", GPUs {'|'.join(gpus[name])}"
        lines.append(f"  {name:<11} {dict(mesh.extent)} on {on}: {desc}")
    lines.append(f"  weights     trainer -> generators by {', '.join(g.transports)} (cluster.transport="
                 f"{c.cluster.transport})")
    lines.append(f"  controller  this process (pid {os.getpid()}): GRPO loop (rlexp/loop.py), data order, replay "
                 f"buffer (max_policy_age={c.sync.policy_age}), evaluation, checkpoints; replica faults: respawn up to "
                 f"{c.cluster.fault.max_restarts}x, then retire")
    return lines


def run(cfg: DictConfig, phases: Phases | None = None) -> dict[str, float]:
    """`rlexp train` body: validate, spawn, train, evaluate, checkpoint, tear down. Returns final metrics.
    `phases`: the start-up clock of the caller (which said when the config was composed), else one from here."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    runlog.attach()  # console summary/progress/final lines go to train.log too
    # This process is Monarch's root: its actor prefix (`[actor=<root>] `, added once per log handler) says nothing.
    monarch_config.prefix_python_logs_with_actor = False
    if cfg.resume == "auto" and (done := checkpoints.finished(run_dir, cfg.steps)) is not None:
        print(f"[rlexp] {done}", flush=True)  # a plain print: the finished run's folder is left untouched
        return read_manifest(run_dir).final_metrics
    if phases is None:
        phases = Phases(since_start=True)
        phases.done("started, config composed")
    p = prepare(cfg)
    phases.done("checks done (config, memory plan, data, reward, model files)")
    resume_from = checkpoints.find_resume(p.cfg.resume, run_dir, say=runlog.announce)  # checked, intact
    cfg_hash = checkpoints.resume_hash(cfg)
    if resume_from is not None:
        checkpoints.check_resume_config(resume_from, cfg_hash, p.cfg.force_resume)
        checkpoints.truncate_metrics(run_dir, checkpoints.read_meta(resume_from)["step"])
    manifest = write_start_manifest(run_dir, cfg, sys.argv, p.seeds,
                                    {**p.extra, "resumed_from": str(resume_from) if resume_from else None})
    run_name = f"{run_dir.name}-{os.getpid()}"
    release_stale_weights(p.cfg)
    interrupts = Interrupts()
    previous = {sig: signal.signal(sig, interrupts.handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    graph: Graph | None = None
    previous_hook = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = report_fault  # handled here: callers see the error, services recover
    try:
        with build_trackers(cfg.logger, cfg, run_dir, manifest) as trackers:
            graph = Graph(Hosts(p.cfg.cluster))
            phases.done(f"hosts up (cluster={p.cfg.cluster.name})")
            build_graph(p, run_name, graph, run_dir, phase=phases.done)
            phases.done("weights loaded, engines ready")
            runlog.announce("\n".join([*graph.placement, *runlog.tracker_lines(trackers.manifest, run_dir)]))
            assert graph.services is not None
            elastic = Elastic(graph, run_dir)

            def between_steps(final: bool = False) -> None:
                interrupts.check(final)
                if not final:
                    elastic.check()

            ctl = Controller(p, graph.services, run_dir, trackers, cfg_hash, between_steps=between_steps)
            interrupts.deferred = True
            try:
                final = ctl.run(resume_from)
            except Exception as e:
                if not (is_process_failure(e) or isinstance(e, ServiceDown)):
                    raise
                last = None
                with contextlib.suppress(checkpoints.ResumeError):  # none intact: the message says start again
                    last = checkpoints.find_resume("auto", run_dir)
                raise RunStopped(stop_message(e, ctl.state.step, last)) from e
            trackers.final_metrics.update(final)
            return final
    finally:
        interrupts.deferred = False
        if graph is not None:
            graph.stop()
        release_weights(p.cfg, run_name)
        monarch.actor.unhandled_fault_hook = previous_hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_message(e: BaseException, step: int, last: Path | None) -> str:
    what = (f"a trainer process died at step {step + 1} ({_last_line(e)}). Trainer ranks hold the only copy of "
            f"the optimizer state, so the run cannot go on without them"
            if is_process_failure(e) else f"at step {step + 1}: {e}")
    return what + (f". The last checkpoint, {last}, is intact: continue with the same command plus resume=auto"
                   if last else ". No checkpoint was written yet (checkpoint.every_n_steps): start again")


def report_fault(failure: Any) -> None:
    """Monarch's hook for a process failure nobody supervises: by default it exits the controller. Here it
    only reports; the call that was waiting on the process raises, and its service respawns or retires the
    replica (rlexp/services.py), or, for a trainer rank, the run stops with its checkpoint intact."""
    print(f"[rlexp] process failure: {_last_line(failure)}", file=sys.stderr, flush=True)


def _last_line(e: Any) -> str:
    text = str(e).strip()
    return text.splitlines()[-1].strip()[:300] if text else type(e).__name__


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


class Elastic:
    """Generator replicas resized between steps: write a number to `<run dir>/generator_replicas` and the run
    adds replicas (new processes, given the current weights first) or retires the newest ones, with a logged
    reason, at the next step boundary. Samples do not change: they depend on `generator.shards`, not on the
    replicas serving them."""

    FILE = "generator_replicas"

    def __init__(self, graph: Graph, run_dir: Path) -> None:
        self.graph, self.path = graph, run_dir / self.FILE
        self._refused: str | None = None  # the last unusable content, announced once

    def check(self) -> None:
        try:
            text = self.path.read_text().strip()
        except (FileNotFoundError, UnicodeDecodeError):
            return
        if not text.isdigit() or len(text) > 6:  # a count of replicas, nothing else
            if text != self._refused:
                runlog.announce(f"[rlexp] {self.path}: {text[:40]!r} is not a number of replicas; ignored")
                self._refused = text
            return
        want = int(text)
        svc = self.graph.services.generators if self.graph.services else None
        if svc is None or self.graph.add_generator is None:
            return
        if want < 1:
            runlog.announce(f"[rlexp] {self.path}: {want} replicas would stop generation; keeping {len(svc)}")
            return
        while len(svc) < want:
            self.graph.add_generator()
        while len(svc) > want:
            i = svc.healthy()[-1]
            svc.retire(i, f"scaled down to {want} ({self.path})")
            with contextlib.suppress(Exception):
                self.graph.mesh(f"generator{i}").stop().get(timeout=30)


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
