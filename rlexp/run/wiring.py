"""The actor graph's roles, declared once: who, how many, on which hosts, with what settings.

`rlexp.run.launcher.build_graph` spawns these roles into processes on the run's hosts;
`rlexp.run.inprocess.build_inprocess` builds the very same settings as plain objects in one process. What only
exists once processes do (the weight transport of each trainer->generator pair, the trainer's rendezvous port)
is passed by the launcher as keyword arguments; everything else an actor is built from is here.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlexp.actors.generator import Generator
from rlexp.actors.reward import RewardService
from rlexp.actors.settings import (
    BufferSettings,
    GeneratorSettings,
    RewardSettings,
    TrainerSettings,
    VerifierSettings,
)
from rlexp.actors.trainer import Reference, Trainer
from rlexp.actors.verifier import VerifierService
from rlexp.models.parallel import PolicySettings, Ranks
from rlexp.models.tokenizer import load_tokenizer
from rlexp.run.prepare import Prepared


@dataclass(frozen=True)
class Role:
    """One mesh of the graph. `hosts`/`index` pick its host (`rlexp.cluster.hosts.Hosts.host`: replica `index` of
    the `cluster.hosts_per_role` group `hosts`); `procs` processes each run the actor (trainer ranks, verifier
    replicas); `on` names the role whose processes it shares instead (the reference sits on the trainer's)."""

    name: str
    actor: type
    settings: Any
    hosts: str
    index: int = 0
    procs: int = 1
    on: str | None = None


@dataclass(frozen=True)
class Wiring:
    trainer: Role
    reference: Role | None
    generators: list[Role]
    verifiers: list[Role]
    rewards: list[Role]
    # The reward roles run as objects in the controller (`reward_in_controller`), not in processes of their own.
    rewards_in_controller: bool
    buffer: BufferSettings
    generator_seeds: tuple[int, ...]  # one per shard of a generate call, fixed for the run
    # mesh name -> each rank's GPUs (`Prepared.gpus`; none on CPU or in-process)
    gpus: dict[str, list[str]] = field(default_factory=dict)

    def roles(self) -> list[Role]:
        """The roles that get processes, in spawn order: the trainer first (the machine it lands on decides each
        generator's transport)."""
        return [self.trainer, *self.generators, *([self.reference] if self.reference else []), *self.verifiers,
                *([] if self.rewards_in_controller else self.rewards)]


def with_master_port(role: Role, port: int | str) -> Role:
    """The trainer's or reference's role with the rendezvous port the launcher found once their processes existed."""
    st = role.settings
    if isinstance(st, TrainerSettings):
        policy = replace(st.policy, ranks=replace(st.policy.ranks, master_port=port))
        return replace(role, settings=replace(st, policy=policy))
    return replace(role, settings=replace(st, ranks=replace(st.ranks, master_port=port)))


def generator_options(p: Prepared) -> dict[str, Any]:
    """`rlexp.models.backends.build_backend`'s options for this run's backend."""
    cfg = p.cfg
    g = cfg.generator
    opts: dict[str, Any] = {"device": cfg.cluster.device, "ignore_eos": g.ignore_eos}
    if g.backend != "titan":
        opts.update(tp=g.tp, kv_cache_gb=g.kv_cache_gb, gpu_memory_utilization=g.gpu_memory_utilization,
                    enforce_eager=g.enforce_eager, max_num_seqs=g.max_num_seqs,
                    max_num_batched_tokens=g.max_num_batched_tokens)
    return opts


def generator_role(p: Prepared, i: int, spawned: bool = True) -> Role:
    """Generator replica `i`, also one added later (elastic) or respawned: it takes the seed of
    shard i mod shards. `spawned`: in a process of its own, whose GPUs were masked at spawn (see
    `wiring`)."""
    cfg = p.cfg
    seeds = generator_seeds(p)
    gpus = p.gpus.get(f"generator{i}", [None])[0] if spawned else None
    return Role(f"generator{i}", Generator,
                GeneratorSettings(cfg.model, p.model_dir, cfg.generator.backend, seeds[i % len(seeds)],
                                  cfg.cluster.threads_per_proc, generator_options(p), gpus),
                hosts="generator", index=i)


def reward_role(p: Prepared, i: int) -> Role:
    cfg = p.cfg
    return Role(f"reward{i}", RewardService, RewardSettings(cfg.reward, cfg.environment), hosts="reward", index=i)


def reward_in_controller(p: Prepared) -> bool:
    """A pure reward (`rlexp.rewards.base.Reward.pure`: rule checks, the annotated oracle) is scored by the controller
    unless the run asks for it elsewhere (more than one replica, or hosts of its own in `cluster.hosts_per_role`):
    scoring 1,024 one-token answers takes less time than the message to another process and back (5 ms a step
    on two cores, studies/perf/results/perf_cpu.md), and a pure function has no state a process death could lose."""
    cfg = p.cfg
    return p.reward_pure and cfg.reward.replicas == 1 and not cfg.cluster.role_hosts.get("reward")


def generator_seeds(p: Prepared) -> tuple[int, ...]:
    return tuple(p.seeds[f"generator/{i}"] for i in range(p.cfg.generator.shards))


def wiring(p: Prepared, spawned: bool = True) -> Wiring:
    """The run's roles and their settings. `spawned` (the launcher): each role in processes of its
    own whose GPUs were masked at spawn (`rlexp.core.gpu_mask`), which the actors check; False
    (`rlexp.run.inprocess`): every role in this one process, on its device, no masks."""
    cfg = p.cfg
    gpus = p.gpus if spawned else {}
    par = cfg.model.parallelism
    ranks = Ranks(world=par.trainer_world, tp=par.trainer_tp, device=cfg.cluster.device, gpus=gpus.get("trainer"),
                  threads=cfg.cluster.threads_per_proc)
    policy = PolicySettings(cfg.model, p.model_dir, load_tokenizer(p.model_dir).pad_id, ranks,
                            mixed_precision=cfg.trainer.mixed_precision,
                            activation_checkpointing=cfg.trainer.activation_checkpointing)
    trainer = Role("trainer", Trainer,
                   TrainerSettings(policy, cfg.trainer, cfg.algorithm, cfg.steps, p.seeds["trainer"]),
                   hosts="trainer", procs=par.trainer_world)
    # The reference model shares the trainer's processes (and GPUs), sharded the same way; nothing to recompute.
    reference = (Role("reference", Reference, PolicySettings(cfg.model, p.model_dir, policy.pad_id, ranks,
                                                             mixed_precision=cfg.trainer.mixed_precision),
                      hosts="trainer", procs=par.trainer_world, on="trainer")
                 if cfg.algorithm.kl_coef > 0 else None)
    # Each model verifier gets processes of its own: scaled and placed apart from the policy and the reward.
    verifiers = [Role(f"verifier_{v.name}", VerifierService,
                      VerifierSettings(v, cfg.environment, cfg.cluster.threads_per_proc, cfg.cluster.device,
                                       gpus.get(f"verifier_{v.name}")),
                      hosts="verifier", index=k, procs=v.replicas)
                 for k, v in enumerate(p.served_verifiers)]
    return Wiring(trainer=trainer, reference=reference,
                  generators=[generator_role(p, i, spawned) for i in range(cfg.generator.replicas)],
                  verifiers=verifiers, rewards=[reward_role(p, i) for i in range(cfg.reward.replicas)],
                  rewards_in_controller=reward_in_controller(p),
                  # The replay buffer is light state saved in checkpoints, read and written every step: it lives in
                  # the controller (a `Local`), where a step's episodes cost no message each way.
                  buffer=BufferSettings(p.seeds["buffer"], cfg.sync.policy_age),
                  generator_seeds=generator_seeds(p), gpus=gpus)

