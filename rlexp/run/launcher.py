"""`rlexp train`: from a composed config to a running actor graph, and back down again whatever happens.

`prepare` checks everything that needs no process first; then the graph is spawned, the controller
runs the loop, and teardown runs in `finally` and on SIGTERM, so no process outlives the run.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import monarch.actor
from hydra.core.hydra_config import HydraConfig
from monarch._src.actor import config as monarch_config  # the switch has no public home in Monarch 0.7
from omegaconf import DictConfig

from rlexp.actors.buffer import ReplayBuffer
from rlexp.actors.probe import Probe, free_port
from rlexp.cluster.hosts import LOCAL, ROLES, Host, Hosts
from rlexp.cluster.registry import job_backend
from rlexp.config.schema import ClusterConfig, TrainConfig
from rlexp.core import gpu_mask
from rlexp.core.services import Collective, Local, Service, ServiceDown, Services, is_process_failure
from rlexp.errors import RunStopped
from rlexp.run import checkpoints
from rlexp.run.controller import Controller
from rlexp.run.elastic import Elastic
from rlexp.run.interrupts import Interrupts, report_fault, stop_checkpoint, stop_message
from rlexp.run.labels import reward_label
from rlexp.run.phases import Phases
from rlexp.run.prepare import CHECKS_DONE, Prepared, prepare, recorded
from rlexp.run.wiring import (
    Role,
    Wiring,
    generator_role,
    reward_in_controller,
    reward_role,
    wiring,
    with_master_port,
)
from rlexp.tracking import runlog
from rlexp.tracking.files import atomic_write_text
from rlexp.tracking.manifest import read_manifest, write_start_manifest
from rlexp.tracking.registry import build_trackers
from rlexp.transport import TransportSpec, registry as transports
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
        self.starting: dict[str, Any] = {}  # name -> its `where` probe's answer, not yet read
        self.placement: list[str] = []
        self.services: Services | None = None
        self.add_generator: Callable[[], None] | None = None  # set by build_graph
        self.transports: list[str] = []  # per generator replica: how its weights arrive
        # mesh name -> each rank's GPUs (`rlexp.run.wiring.Wiring.gpus`; empty on CPU)
        self.gpus: dict[str, list[str]] = {}

    def spawn(self, name: str, cls: type, *args: Any, procs: int = 1, host: Host | None = None,
              mesh: Any = None) -> Any:
        """`cls` on a new proc mesh of `procs` processes on `host` (default: the role's first host), or on
        `mesh` when it shares another actor's processes."""
        return (mesh if mesh is not None else self.procs(name, procs, host)).spawn(name, cls, *args)

    def spawn_role(self, role: Role, host: Host | None = None, **given: Any) -> Any:
        """`role`'s actor with its settings and what the launcher gives it (`given`: keyword arguments), on the
        processes made for it already (`procs`), on the role it shares (`role.on`), or on new ones on `host`
        (default: the host its index picks)."""
        if role.on is not None:
            mesh = self.mesh(role.on)
        elif role.name in self.meshes:
            mesh = self.mesh(role.name)
        else:
            mesh = self.procs(role.name, role.procs, host or self.hosts.host(role.hosts, role.index))
        return mesh.spawn(role.name, role.actor, role.settings, **given)

    def procs(self, name: str, procs: int = 1, host: Host | None = None, *,
              wait: bool = True) -> Any:
        """A new proc mesh for `name`, `procs` processes per host, and where each of them runs.
        Each process starts with rlexp's bootstrap (`gpu_mask.spawn_masks`): on CUDA its GPUs
        masked before anything in it imports torch, on any device a quick exit when it stops.
        `wait=False`: `where` is filled by the next `started()`, so meshes asked for one after the
        other start their processes at the same time."""
        host = host or self.hosts.host(role_of(name))
        bootstrap = gpu_mask.spawn_masks(self.gpus.get(name) or [])
        mesh = host.mesh.spawn_procs(per_host={"procs": procs}, bootstrap_command=bootstrap)
        self.meshes[name] = (mesh, host)
        self.starting[name] = mesh.spawn("probe", Probe).where.call()
        if wait:
            self.started()
        return mesh

    def started(self) -> None:
        """Waits for the meshes asked for with `procs` to answer; records where they run."""
        while self.starting:
            name, answer = next(iter(self.starting.items()))
            self.where[name] = list(answer.get().values())
            del self.starting[name]

    def mesh(self, name: str) -> Any:
        return self.meshes[name][0]

    def drop(self, name: str) -> Host:
        """Stop `name`'s processes (after one died: Monarch may still report the stop as failed); returns its host."""
        mesh, host = self.meshes.pop(name)
        self.where.pop(name, None)
        self.starting.pop(name, None)
        with contextlib.suppress(Exception):
            mesh.stop().get(timeout=10)
        return host

    def write_placement(self, path: Path) -> None:
        """Where every role's processes run (name -> host label, hostname, pid), rewritten after a respawn."""
        data = {name: [{**w, "host": self.meshes[name][1].label} for w in where] for name, where in self.where.items()}
        atomic_write_text(path, json.dumps(data, indent=2))

    def stop(self) -> None:
        """Every mesh's processes stopped, all asked at once (each waits for its processes to exit),
        newest first; then the job's hosts."""
        stopping = []
        for name, (mesh, _) in reversed(list(self.meshes.items())):
            try:
                stopping.append((name, mesh.stop()))
            except Exception as e:  # teardown must go on to the next mesh
                print(f"[rlexp] stopping {name}: {e}", file=sys.stderr)
        for name, stopped in stopping:
            try:
                stopped.get(timeout=30)
            except Exception as e:
                print(f"[rlexp] stopping {name}: {e}", file=sys.stderr)
        self.meshes.clear()
        self.hosts.close()


class WeightPairs:
    """Which weight transport each trainer->generator pair uses, decided by the machines the two processes turned
    out to run on (`pair_transports`: shm on one machine, tcp across), and the transports' server actors."""

    def __init__(self, graph: Graph, cluster: ClusterConfig, run_name: str) -> None:
        self.g, self.cluster, self.run_name = graph, cluster, run_name
        self.trainer_machine = ""
        self.servers: dict[str, Any] = {}  # transport -> its server actor (monarch's), on the trainer's first process

    def transport_for(self, name: str) -> str:
        machine = self.g.where[name][0]["hostname"]
        cluster = self.cluster
        return pair_transports(cluster.transport, self.trainer_machine, [machine], cluster)[0]

    def spec(self, transport: str) -> TransportSpec:
        return transport_spec(transport, self.run_name, self.cluster)

    def start_servers(self, trainer_mesh: Any) -> None:
        for t in dict.fromkeys(self.g.transports):
            server = resolve(t).server
            if server is not None:
                self.servers[t] = self.g.spawn(transports.server_actor(t), server,
                                               mesh=first_proc(trainer_mesh))

    def spawn_generator(self, role: Role) -> Any:
        """`role`'s generator on the processes made for it, given its pair's transport."""
        return self.g.spawn_role(role, weights=self.spec(self.transport_for(role.name)))

    def connect(self, gen: Any, name: str) -> Any:
        server = self.servers.get(self.transport_for(name))
        if server is not None:
            gen.connect_weights.call_one(server).get()
        return gen


class Recovery:
    """What the services call when a replica's process died (`Service.replica_failed`): the same role respawned on
    the same host, its settings unchanged; and one more generator replica when the run is resized (elastic)."""

    def __init__(self, g: Graph, p: Prepared, pairs: WeightPairs, attach: Callable[[int, Any], Any],
                 placement: Path | None) -> None:
        self.g, self.p, self.pairs, self.attach, self.placement = g, p, pairs, attach, placement

    def respawned(self, handle: Any) -> Any:
        if self.placement is not None:
            self.g.write_placement(self.placement)
        return handle

    def new_generator(self, i: int) -> Any:
        """Generator replica i on its host, set up and connected to the weights; the generators service then
        gives it the current version before it serves."""
        role = generator_role(self.p, i)
        self.g.procs(role.name, 1, self.g.hosts.host(role.hosts, role.index))
        needed = self.pairs.transport_for(role.name)
        if needed not in self.g.transports:
            raise RuntimeError(f"{role.name} would need the {needed} weight transport, which this run's trainer "
                               f"does not publish ({sorted(set(self.g.transports))})")
        gen = self.pairs.spawn_generator(role)
        gen.setup.call_one().get()
        return self.pairs.connect(gen, role.name)

    def generator(self, i: int, error: BaseException) -> Any:
        if not self.p.cfg.cluster.fault.respawn:
            return None
        self.g.drop(f"generator{i}")
        return self.respawned(self.new_generator(i))  # the service replays the current weights version first

    def reward(self, i: int, error: BaseException) -> Any:
        if not self.p.cfg.cluster.fault.respawn:
            return None
        role = reward_role(self.p, i)
        return self.respawned(self.attach(i, self.g.spawn_role(role, host=self.g.drop(role.name))))

    def generators_changed(self) -> None:
        """A generator replica was replaced, retired or added: each live reward replica's policy
        judges are given the live generators (`attach_judges`; those they held may be dead)."""
        assert self.g.services is not None
        rewards, gens = self.g.services.rewards, self.g.services.generators
        for j in rewards.healthy():
            try:
                rewards.replicas[j].attach_judges.call_one(gens.in_turn(j), self.p.model_dir).get()
            except Exception as e:  # a dead reward replica: its service respawns it, attached anew
                if not is_process_failure(e):
                    raise

    def add_generator(self) -> None:
        """One more generator replica (elastic), on the role's next host."""
        assert self.g.services is not None
        i = len(self.g.services.generators.replicas)
        gen = self.new_generator(i)
        self.g.services.generators.add_replica(gen, f"generator{i}@{self.g.meshes[f'generator{i}'][1].label}")
        self.respawned(gen)


def rendezvous_port(g: Graph, cfg: TrainConfig, trainer_mesh: Any, world: int) -> int | str:
    """The trainer's process-group port: none on one rank; on rank 0's host when the trainer spans hosts."""
    if world == 1:
        return 0
    if job_backend(cfg.cluster.job).remote_rendezvous and cfg.cluster.role_hosts.get("trainer"):
        rank0 = first_proc(trainer_mesh).spawn("port_probe", Probe)
        return f"{g.where['trainer'][0]['hostname']}:{rank0.free_port.call_one().get()}"
    return free_port("127.0.0.1")  # the trainer's process group, all on this machine


def build_graph(p: Prepared, run_name: str, g: Graph | None = None, run_dir: Path | None = None,
                phase: Callable[[str], object] | None = None) -> Graph:
    """Spawn the roles of `rlexp.run.wiring.wiring` on their hosts (into `g`, so a failure half-way still stops what
    started), set them up and wire them into `Services`, with a `Recovery` for each replica. `phase` is told when
    the processes are up and as each role has loaded its weights: the long waits of start-up."""
    cfg = p.cfg
    g = g if g is not None else Graph(Hosts(cfg.cluster))
    w = wiring(p)
    g.gpus = w.gpus
    pairs = WeightPairs(g, cfg.cluster, run_name)
    # The trainer's processes first: the machine they run on decides each generator's weight transport. The trainer
    # is one proc, or one per (FSDP x TP) rank (one GPU each on CUDA), `world / hosts` ranks on each host when it
    # spans hosts. See rlexp/actors/trainer.py.
    # All of them start at once (each pays an interpreter's and Monarch's start);
    # then their machines are known.
    per_host = w.trainer.procs // len(g.hosts.roles["trainer"])
    trainer_mesh = g.procs("trainer", per_host, g.hosts.whole("trainer"), wait=False)
    for role in w.generators:
        g.procs(role.name, 1, g.hosts.host(role.hosts, role.index), wait=False)
    g.started()
    pairs.trainer_machine = g.where["trainer"][0]["hostname"]
    g.transports = [pairs.transport_for(role.name) for role in w.generators]
    gens = [pairs.spawn_generator(role) for role in w.generators]
    port = rendezvous_port(g, cfg, trainer_mesh, w.trainer.procs)
    trainer = g.spawn_role(with_master_port(w.trainer, port),
                           transports=[pairs.spec(t) for t in dict.fromkeys(g.transports)])
    pairs.start_servers(trainer_mesh)
    for role, gen in zip(w.generators, gens):
        pairs.connect(gen, role.name)
    reference = g.spawn_role(with_master_port(w.reference, port)) if w.reference is not None else None
    verifiers = {role.settings.verifier.name: g.spawn_role(role) for role in w.verifiers}
    rewards = [Local(role.actor, role.settings) if w.rewards_in_controller else g.spawn_role(role)
               for role in w.rewards]
    if phase is not None:
        procs = sum(len(where) for where in g.where.values())
        phase(f"processes spawned ({procs} in {len(g.meshes)} meshes: {', '.join(g.meshes)})")
    n_params, gen_times, verifier_s = set_up(w, gens, trainer, verifiers, reference, phase)
    replicas = {r.settings.verifier.name: [verifiers[r.settings.verifier.name].slice(procs=j) for j in range(r.procs)]
                for r in w.verifiers}

    def attach(i: int, r: Any) -> Any:
        r.attach_verifiers.call_one(replicas).get()
        # judges that are the policy itself ask the live generators, generator i (mod n) first
        r.attach_judges.call_one(generators.in_turn(i), p.model_dir).get()
        return r

    placement = (run_dir / "placement.json") if run_dir is not None else None
    recovery = Recovery(g, p, pairs, attach, placement)
    g.add_generator = recovery.add_generator
    fault = cfg.cluster.fault

    def log(msg: str) -> None:
        runlog.announce(f"[rlexp] {msg}")

    def labels(roles: list[Role]) -> list[str]:
        return [f"{r.name}@{g.meshes[r.name][1].label}" for r in roles]

    generators = Service("generators", gens, shards=len(w.generator_seeds), recover=recovery.generator,
                         max_restarts=fault.max_restarts, sticky=("update_weights",), log=log,
                         labels=labels(w.generators), changed=recovery.generators_changed)
    for i, r in enumerate(rewards):
        attach(i, r)
    g.services = Services(
        generators=generators,
        trainer=Collective("trainer", trainer),
        rewards=Service("rewards", rewards, log=log, labels=["reward@controller"]) if w.rewards_in_controller else
        Service("rewards", rewards, recover=recovery.reward, max_restarts=fault.max_restarts, log=log,
                state=("state_dict", "load_state_dict") if p.reward_stateful else None, labels=labels(w.rewards)),
        # The replay buffer is light state saved in checkpoints, read and written every step: it lives in the
        # controller (a `Local`), where a step's episodes cost no message each way, and whose death ends the run.
        buffer=Service("buffer", [Local(ReplayBuffer, w.buffer)]),
        reference=Collective("reference", reference) if reference is not None else None,
        generator_seeds=w.generator_seeds)
    if placement is not None:
        g.write_placement(placement)
    g.placement = describe_placement(g, cfg, n_params, gen_times, p, verifier_s)
    return g


def set_up(wired: Wiring, gens: list[Any], trainer: Any, verifiers: dict[str, Any], reference: Any,
           phase: Callable[[str], object] | None) -> tuple[int, list[float], dict[str, float]]:
    """Every spawned role loads its weights: the verifiers while the policy loads, the reference
    model after the trainer (it joins the trainer's process group). `phase` is told as each role is
    ready: many verifiers can take minutes on a loaded CPU. Returns the trainer's parameter count,
    each generator's set-up seconds and each verifier's. A function of its own: the long waits of
    start-up, apart from the spawning and wiring in `build_graph`."""
    # the verifiers load while the policy loads
    verifier_setup = {name: m.setup.call() for name, m in verifiers.items()}
    # every trainer rank sets up
    setup = [m.setup.call_one() for m in gens] + [trainer.setup.call()]
    times: list[Any] = []
    for name, f in zip([*(r.name for r in wired.generators), "trainer"], setup):
        times.append(f.get())
        if phase is not None:
            phase(f"{name} ready")
    n_params = next(iter(times[-1].values()))  # rank 0's answer
    verifier_s: dict[str, float] = {}
    for name, f in verifier_setup.items():
        verifier_s[name] = max(f.get().values())
        if phase is not None:
            phase(f"verifier_{name} ready")
    if reference is not None:  # after the trainer: it joins the trainer's process group
        reference.setup.call().get()
    return n_params, times[:-1], verifier_s


def first_proc(mesh: Any) -> Any:
    """Rank 0's process of a proc mesh, whatever its dimensions ({procs} here, {hosts, procs} across hosts)."""
    return mesh.slice(**dict.fromkeys(dict(mesh.extent), 0))


def describe_placement(g: Graph, cfg: TrainConfig, n_params: int, gen_setup_s: list[float], p: Prepared,
                       verifier_s: dict[str, float]) -> list[str]:
    n_hosts = len({h.label for hosts in g.hosts.roles.values() for h in hosts} | {LOCAL})
    job = job_backend(cfg.cluster.job).describe(cfg.cluster)
    lines = [f"actor graph (cluster={cfg.cluster.name}: {job}, {cfg.cluster.device}, "
             f"{n_hosts} host{'s' if n_hosts > 1 else ''} with the controller's):"]
    gpus = g.gpus
    par = cfg.model.parallelism
    for name, (mesh, host) in g.meshes.items():
        role = {"generator": f"{cfg.generator.backend} backend, engine ready in {{:.1f}}s",
                "trainer": f"TorchTitan Qwen3 {n_params/1e6:.2f}M params, AdamW lr={cfg.trainer.lr}"
                           + (f", {par.trainer_world} ranks (FSDP2 {par.trainer_fsdp} x TP {par.trainer_tp})"
                              if par.trainer_world > 1 else "")
                           + (", activation checkpointing" if cfg.trainer.activation_checkpointing else "")
                           + (", bf16 mixed precision" if cfg.trainer.mixed_precision else "")
                           + ("; reference model (frozen initial policy, KL) on the same procs"
                              if cfg.algorithm.kl_coef > 0 else ""),
                "reward": reward_label(cfg.reward)
                          + (f" over {len(cfg.reward.verifiers)} verifiers" if cfg.reward.verifiers else ""),
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
    if reward_in_controller(p):
        lines.append(f"  reward      this process: {reward_label(cfg.reward)}, a pure function, scored by "
                     f"the controller (rlexp.run.wiring.reward_in_controller)")
    lines.append(f"  weights     trainer -> generators by {', '.join(g.transports)} (cluster.transport="
                 f"{cfg.cluster.transport})")
    lines.append(f"  controller  this process (pid {os.getpid()}): GRPO loop (rlexp/algorithm/loop.py), data order, "
                 f"replay buffer (max_policy_age={cfg.sync.policy_age}), evaluation, checkpoints; replica faults: "
                 f"respawn up to {cfg.cluster.fault.max_restarts}x, then retire")
    return lines


def run(cfg: DictConfig, phases: Phases | None = None) -> dict[str, float]:
    """`rlexp train` body: validate, spawn, train, evaluate, checkpoint, tear down. Returns final metrics.
    `phases`: the start-up clock of the caller (which said when the config was composed), else one from here."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    runlog.attach()  # console summary/progress/final lines go to train.log too
    # This process is Monarch's root: its actor prefix (`[actor=<root>] `, added once per log handler) says nothing.
    monarch_config.prefix_python_logs_with_actor = False
    if cfg.resume == "auto" and (done := checkpoints.finished(run_dir, cfg.steps)) is not None:
        checkpoints.check_finished_config(run_dir, cfg)
        print(f"[rlexp] {done}", flush=True)  # a plain print: the finished run's folder is left untouched
        return read_manifest(run_dir).final_metrics
    if phases is None:
        phases = Phases(since_start=True)
        phases.done("started, config composed")
    p = prepare(cfg, phase=phases.done)  # refuses a bad value (an interpolation of the wrong type, say) naming the key
    # the resume hash is of the config as composed (after `prepare`: a plug-in may add a resolver);
    # `prepare` derives values in the typed config only
    cfg_hash = checkpoints.resume_hash(cfg)
    record = recorded(cfg, p.cfg)  # what the manifest and the trackers record, derived values too
    phases.done("model.warmup done" if p.cfg.model.warmup.steps else CHECKS_DONE)
    resume_from = checkpoints.resume_point(run_dir, p.cfg.resume, p.cfg.steps, p.cfg.force_resume, cfg_hash,
                                           checkpoints.resume_hash(record), say=runlog.announce,
                                           ema_decay=p.cfg.trainer.ema_decay)
    resumed = {"resumed_from": str(resume_from) if resume_from else None}
    manifest = write_start_manifest(run_dir, record, sys.argv, p.seeds, {**p.extra, **resumed})
    run_name = f"{run_dir.name}-{os.getpid()}"
    release_stale_weights(p.cfg.cluster)
    interrupts = Interrupts()
    previous = {sig: signal.signal(sig, interrupts.handler) for sig in Interrupts.SIGNALS}
    graph: Graph | None = None
    previous_hook = monarch.actor.unhandled_fault_hook
    monarch.actor.unhandled_fault_hook = report_fault  # handled here: callers see the error, services recover
    try:
        trackers_of_run = build_trackers(p.cfg.logger, record, run_dir, manifest)
        with trackers_of_run as trackers, interrupts.record_on_exit():
            graph = Graph(Hosts(p.cfg.cluster))
            phases.done(f"hosts up (cluster={p.cfg.cluster.name})")
            build_graph(p, run_name, graph, run_dir, phase=phases.done)
            phases.done("weights loaded, engines ready")
            runlog.announce("\n".join([*graph.placement, *runlog.tracker_lines(trackers.manifest, run_dir)]))
            assert graph.services is not None
            elastic = Elastic(graph, run_dir)

            first_step = [True]

            def between_steps(final: bool = False) -> None:
                if first_step:  # the last start-up phase: the step-0 evaluation and the first step itself
                    phases.done("first step done")
                    first_step.clear()
                if interrupts.pending in Interrupts.CHECKPOINT:
                    stop_checkpoint(ctl, interrupts, run_dir)
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
        interrupts.deferred = interrupts.recording = False  # tearing the graph down stays interruptible
        if graph is not None:
            graph.stop()
        release_weights(p.cfg.cluster, run_name)
        monarch.actor.unhandled_fault_hook = previous_hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def release_stale_weights(cluster: ClusterConfig) -> None:
    """Set-up: what runs that died without tearing down (kill -9, OOM) left, freed by each transport
    that leaves files (`WeightTransport.release_stale`: only what that transport made is touched).
    """
    transports.release_stale(cluster)


def release_weights(cluster: ClusterConfig, run_name: str) -> None:
    """Clean-up: the run's published weights, freed by their transport, also when the trainer died
    first."""
    transports.release(cluster, run_name)

