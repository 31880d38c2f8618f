"""Which GPUs (on CPU: how many threads) each role's processes get on each host, and which model verifiers a
run serves (what `rlexp plan` counts)."""
from __future__ import annotations

import os

from rlexp.cluster.registry import job_backend
from rlexp.config.reward import RewardConfig, VerifierConfig, VerifierSetConfig
from rlexp.config.schema import ClusterConfig, TrainConfig
from rlexp.config.validate import ConfigError


def reward_verifiers(reward: RewardConfig, verifier_set: VerifierSetConfig) -> list[VerifierConfig]:
    """The served model verifiers the configured reward scores with (its `chosen_verifiers` over
    `reward.verifiers`, or else the members of `verifier_set`). A choice the reward would refuse (or
    an unknown reward or verifier kind) serves nothing here and fails with its own message in
    `prepare`."""
    from rlexp.rewards.registry import reward_class  # the rewards and verifier kinds, registered
    from rlexp.rewards.verifiers.kinds import is_served

    members = list(reward.verifiers) or list(verifier_set.members)
    try:
        chosen = reward_class(reward.name).chosen_verifiers(dict(reward.options), members)
        return [v for v in chosen if is_served(v)]
    except ValueError:
        return []


def own_hosts(cluster: ClusterConfig) -> dict[str, int]:
    """Roles with hosts of their own (`cluster.hosts_per_role`, with a job kind that gives any: not local)."""
    if not job_backend(cluster.job).own_hosts:
        return {}
    return dict(cluster.role_hosts)


def gpu_layout(cfg: TrainConfig) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Each mesh's GPUs per rank (`gpu_placement` without the hosts), and the GPUs each host uses.
    """
    place, used = gpu_placement(cfg)
    return {name: [gpus for _, gpus in ranks] for name, ranks in place.items()}, used


def gpu_placement(cfg: TrainConfig) -> tuple[dict[str, list[tuple[str, str]]], dict[str, int]]:
    """(host label, GPUs) per role and rank, and the GPUs each host uses (by the job's host label).
    The GPUs are rlexp's indices on the host, counted from 0 among those the host's processes may
    use: each process's `CUDA_VISIBLE_DEVICES` is set from them when it is spawned, through a
    scheduler's mask (`rlexp.core.gpu_mask`).

    On the controller's host ("local") the roles without hosts of their own take GPUs in order: trainer
    ranks (the reference model beside them) first, then each generator replica
    (`generator.gpus_per_replica`), then every served model verifier (`reward_verifiers`), one per replica,
    under the key `verifier_<name>`. A role with hosts of its own (`cluster.hosts_per_role`) numbers from 0
    on each of them: trainer ranks in blocks per host (rank r on host r // (W/H)), generator replica i on
    host i % H, verifier k on host k % H. Without it every process would open GPU 0. Empty on CPU."""
    if cfg.cluster.device != "cuda":
        return {}, {}
    own = own_hosts(cfg.cluster)
    used: dict[str, int] = {}

    def take(host: str, n: int) -> list[int]:
        first = used.get(host, 0)
        used[host] = first + n
        return list(range(first, first + n))

    out: dict[str, list[tuple[str, str]]] = {}
    world, per_gen = cfg.model.parallelism.trainer_world, cfg.generator.gpus_per_replica
    if "trainer" in own:
        per_host = -(-world // own["trainer"])
        hosts = [f"trainer_{r // per_host}" for r in range(world)]
        out["trainer"] = [(h, str(take(h, 1)[0])) for h in hosts]
    else:
        out["trainer"] = [("local", str(g)) for g in take("local", world)]
    for i in range(cfg.generator.replicas):
        host = f"generator_{i % own['generator']}" if "generator" in own else "local"
        out[f"generator{i}"] = [(host, ",".join(str(g) for g in take(host, per_gen)))]
    for k, v in enumerate(reward_verifiers(cfg.reward, cfg.verifier_set)):
        host = f"verifier_{k % own['verifier']}" if "verifier" in own else "local"
        out[f"verifier_{v.name}"] = [(host, str(g)) for g in take(host, v.replicas)]
    return out, used


def controller_gpus(cfg: TrainConfig) -> int:
    """GPUs the run's processes take on the controller's machine (what
    `rlexp.cluster.planner.check_devices` checks here): the roles without hosts of their own, 0 when
    every role has hosts of its own (a Slurm job driven from a login node). A job whose hosts are
    processes of this machine (`one_machine`) numbers each host's GPUs from 0 here too: the busiest
    host's count."""
    _, used = gpu_layout(cfg)
    if job_backend(cfg.cluster.job).one_machine:
        return max(used.values(), default=0)
    return used.get("local", 0)


def assign_gpus(cfg: TrainConfig) -> dict[str, list[str]]:
    return gpu_layout(cfg)[0]


def verifier_gpus(cfg: TrainConfig) -> int:
    """GPUs the served model verifiers take: one per replica."""
    return sum(v.replicas for v in reward_verifiers(cfg.reward, cfg.verifier_set))


def gpus_needed(cfg: TrainConfig) -> int:
    generator = cfg.generator
    return (cfg.model.parallelism.trainer_world + generator.replicas * generator.gpus_per_replica
            + verifier_gpus(cfg))


def check_hosts_fit(cfg: TrainConfig) -> None:
    """Every host's roles fit its GPUs, and no tensor-parallel group spans hosts."""
    par, per_host = cfg.model.parallelism, cfg.cluster.gpus_per_host
    own = own_hosts(cfg.cluster)
    if "trainer" in own:
        hosts = own["trainer"]
        if par.trainer_world % hosts or (par.trainer_world // hosts) % par.trainer_tp:
            raise ConfigError(
                f"the trainer's {par.trainer_world} ranks (FSDP {par.trainer_fsdp} x TP {par.trainer_tp}) do not split "
                f"into whole TP groups over cluster.hosts_per_role.trainer={hosts} hosts: make the ranks per host a "
                f"multiple of trainer_tp")
    if cfg.generator.gpus_per_replica > per_host:
        raise ConfigError(f"a generator replica needs {cfg.generator.gpus_per_replica} GPUs "
                          f"(generator.tp) but a host has cluster.gpus_per_host={per_host}: lower "
                          f"generator.tp")
    _, used = gpu_layout(cfg)
    over = {h: n for h, n in used.items() if n > per_host}
    if over:
        where = ", ".join(f"{h}: {n}" for h, n in over.items())
        raise ConfigError(
            f"the layout needs more GPUs than a host has (cluster.gpus_per_host={per_host}; needed per host: {where}; "
            f"trainer {par.trainer_fsdp} x {par.trainer_tp}, generators {cfg.generator.replicas} x "
            f"{cfg.generator.gpus_per_replica}, model verifiers {verifier_gpus(cfg)}). "
            f"Give roles hosts of their own (cluster.hosts_per_role, with cluster.job=slurm|kubernetes), or lower "
            f"model.parallelism.trainer_fsdp / trainer_tp / generator_replicas; check the fit with `rlexp plan`")


def compute_at_once(cfg: TrainConfig) -> int:
    """The most of the run's processes that compute at the same moment. On-policy, the roles take turns
    (generate, score, train), so the busiest phase counts; async, generators, verifiers and trainer overlap."""
    phases = [cfg.generator.replicas, cfg.model.parallelism.trainer_world, verifier_gpus(cfg)]
    return sum(phases) if cfg.sync.mode == "async" else max(phases)


def auto_threads(cfg: TrainConfig, cores: int | None = None) -> int:
    """`cluster.threads_per_proc` when unset: on CPU with every process on this machine, its cores shared among
    the processes that compute at once (at least one each); elsewhere 0, torch's own default, since this
    machine's cores say nothing of another host's."""
    if cfg.cluster.device != "cpu" or not job_backend(cfg.cluster.job).one_machine:
        return 0
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // compute_at_once(cfg))
