"""Per-GPU memory plan for a run, checked before anything launches.

Why: an 8B/32B layout that does not fit fails only after minutes of actor start-up and checkpoint
loading, with an OOM that does not say which knob to turn. The plan is arithmetic on the config
alone (no model build), so `rlexp train` can refuse in milliseconds and say what to change.

Units: `cluster.gpu_memory_gb` is read as GiB (2**30 bytes); an "80 GB" H100 exposes 79.6 GiB, so
writing 80 is fine with the default 10% headroom. All estimates are upper-bound style: they count
what PyTorch/vLLM must hold at the peak, plus a fixed runtime overhead (CUDA context, NCCL buffers,
allocator fragmentation) that experience puts at 1.5-3 GiB.

The arithmetic per role is `rlexp.cluster.memory`'s; here the typed run config becomes its
setups (`setups_from_cfg`), the served verifiers are added, and a layout that does not fit
gets its fixes.

Micro-batch: `trainer.micro_batch_size=0` (trainer=large, what a real model brings) is derived here: the largest
  micro-batch, up to the rows each data-parallel rank trains per step, whose trainer plan fits; the rest of the step's
  rows are gradient accumulation (rlexp/actors/trainer.py splits a step into micro-batches).
Model verifiers (reward models and LM judges the reward serves, `rlexp.cluster.layout.reward_verifiers`), per GPU:
  each replica has a GPU of its own and needs the verifier's `memory_gb` (read as GiB, like
  `cluster.gpu_memory_gb`; the verifier_set files size it as bf16 weights + headroom). These are the
  verifier set's numbers, not derived here: a verifier can be any architecture.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

from rlexp.cluster.layout import reward_verifiers
from rlexp.cluster.memory import (
    DEFAULT_HEADROOM,
    GeneratorSetup,
    GiB,
    RolePlan,
    StepTime,
    TrainerSetup,
    fit_micro_batch,
    generator_plan,
    step_time,
    trainer_plan,
)
from rlexp.cluster.registry import job_backend
from rlexp.config.model import ArchConfig
from rlexp.config.reward import RewardConfig, VerifierSetConfig
from rlexp.config.schema import ClusterConfig, TrainConfig
from rlexp.models.catalog import param_count


class PlanError(RuntimeError):
    """The layout cannot fit; `.report` holds the numbers, the message says what to change."""

    def __init__(self, message: str, report: PlanReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class VerifierPlan:
    """One served model verifier: its own mesh of `replicas` processes, one GPU each."""

    name: str
    kind: str
    replicas: int
    bytes_per_gpu: float  # memory_gb as GiB; 0 = not given (a stand-in, or an unsized checkpoint)
    checkpoint: str  # hf_repo@revision, the local path, or tiny:<name>
    capacity_bytes: float | None

    @property
    def gpus(self) -> int:
        return self.replicas

    @property
    def fits(self) -> bool:
        return self.capacity_bytes is None or self.bytes_per_gpu <= self.capacity_bytes


def verifier_checkpoint_name(options: dict[str, Any]) -> str:
    if options.get("hf_repo"):
        return f"{options['hf_repo']}@{options.get('revision', 'main')}"
    if options.get("tiny"):
        return f"tiny:{options['tiny']}"
    return str(options.get("path") or "?")


def verifier_plans(reward: RewardConfig, verifier_set: VerifierSetConfig,
                   capacity_bytes: float | None = None) -> list[VerifierPlan]:
    """The served model verifiers of the run's reward (none for reward=rule/annotated)."""
    return [VerifierPlan(v.name, str(v.kind), int(v.replicas), float(v.memory_gb or 0.0) * GiB,
                         verifier_checkpoint_name(dict(v.options or {})), capacity_bytes)
            for v in reward_verifiers(reward, verifier_set)]


@dataclass
class PlanReport:
    model: str
    arch: ArchConfig
    trainer: RolePlan
    generator: RolePlan
    gpus_needed: int
    gpus_available: int | None
    gpu_memory_gib: float | None
    headroom: float
    problems: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    verifiers: list[VerifierPlan] = field(default_factory=list)
    reward: str = ""  # reward.name, and the verifier set the verifiers come from, for the table
    micro_batch_size: int = 0  # the trainer's micro-batch: configured, or derived from the plan
    micro_batch_derived: bool = False
    time: StepTime | None = None
    # vLLM's share of each generator GPU (`vllm_memory_utilization`)
    gpu_memory_utilization: float = 0.0

    @property
    def verifier_gpus(self) -> int:
        return sum(v.gpus for v in self.verifiers)

    @property
    def ok(self) -> bool:
        return not self.problems

    def table(self) -> str:
        lines = [f"memory plan for model={self.model} ({param_count(self.arch) / 1e9:.2f}B parameters)"]
        if self.gpu_memory_gib:
            lines.append(f"cluster: {self.gpus_available} GPUs x {self.gpu_memory_gib:g} GiB, usable "
                         f"{self.gpu_memory_gib * (1 - self.headroom):.1f} GiB each after "
                         f"{self.headroom:.0%} headroom; "
                         f"this layout uses {self.gpus_needed}")
        else:
            lines.append("cluster: no GPU memory limit configured (cluster.gpu_memory_gb unset): sizes only")
        if self.micro_batch_derived:
            lines.append(f"trainer.micro_batch_size=0: derived {self.micro_batch_size}, the largest micro-batch whose "
                         f"trainer plan fits")
        for rp in (self.trainer, self.generator):
            lines.append("")
            lines.append(f"{rp.role}: {rp.gpus} GPU(s), {rp.layout}")
            lines.append(f"  {'component':<28}{'GiB/GPU':>10}  arithmetic")
            for it in rp.items:
                during = f" [{it.phase}]" if it.phase else ""
                lines.append(f"  {it.name:<28}{it.bytes / GiB:>10.2f}  {it.how}{during}")
            cap = f" of {rp.capacity_bytes / GiB:.1f}" if rp.capacity_bytes else ""
            verdict = "" if rp.capacity_bytes is None else ("  fits" if rp.fits else "  DOES NOT FIT")
            peak = f"  (held + {rp.peak_phase}, the largest phase)" if rp.peak_phase else ""
            lines.append(f"  {'peak':<28}{rp.total_bytes / GiB:>10.2f}{cap}{verdict}{peak}")
            if rp is self.generator and self.gpu_memory_utilization:
                lines.append(f"  vLLM gpu_memory_utilization {self.gpu_memory_utilization:.2f} "
                             f"(this peak over the GPU's memory; "
                             f"generator.gpu_memory_utilization=0 takes it)")
        if self.verifiers:
            lines.append("")
            lines.append(f"verifiers: {self.verifier_gpus} GPU(s), {len(self.verifiers)} served model verifier(s) of "
                         f"{self.reward}, one mesh each, one GPU per replica")
            w = max(20, *(len(v.name) + 2 for v in self.verifiers))
            lines.append(f"  {'name':<{w}}{'kind':<14}{'replicas':>8}{'GiB/GPU':>10}  checkpoint")
            for v in self.verifiers:
                gib = f"{v.bytes_per_gpu / GiB:>10.2f}" if v.bytes_per_gpu else f"{'?':>10}"
                verdict = "" if v.capacity_bytes is None or not v.bytes_per_gpu else (
                    "  fits" if v.fits else "  DOES NOT FIT")
                lines.append(f"  {v.name:<{w}}{v.kind:<14}{v.replicas:>8}{gib}  {v.checkpoint}{verdict}")
        if self.time is not None:
            lines.append("")
            lines.extend(self.time.lines())
        if self.problems:
            lines.append("")
            lines.extend(f"problem: {p}" for p in self.problems)
            lines.extend(f"fix: {f}" for f in self.fixes)
        return "\n".join(lines)


def setups_from_cfg(cfg: TrainConfig) -> tuple[ArchConfig, TrainerSetup, GeneratorSetup]:
    """The model's shape and the trainer's and generators' layouts, from the typed run config: the
    effective generator layout (`generator.tp`/`replicas`, which default to the model's), the step's
    sequences and their full length."""
    model, algorithm, trainer, generator = cfg.model, cfg.algorithm, cfg.trainer, cfg.generator
    seq_len = algorithm.max_prompt_tokens + algorithm.max_tokens
    dtype = str(model.dtype)
    seqs = algorithm.prompts_per_step * algorithm.group_size
    par = model.parallelism
    trainer_setup = TrainerSetup(
        fsdp=par.trainer_fsdp,
        tp=par.trainer_tp,
        micro_batch_size=trainer.micro_batch_size,
        seq_len=seq_len,
        activation_checkpointing=bool(trainer.activation_checkpointing),
        # the trainer keeps fp32 masters whenever it computes in a half dtype (rlexp.models.parallel)
        mixed_precision=bool(trainer.mixed_precision) or dtype != "float32",
        dtype=dtype,
        reference_model=algorithm.kl_coef > 0,
        rows_per_rank=math.ceil(seqs / par.trainer_fsdp),
    )
    generator_setup = GeneratorSetup(
        tp=generator.tp or par.generator_tp,
        replicas=generator.replicas or par.generator_replicas,
        seqs_per_step=seqs,
        seq_len=seq_len,
        dtype="bfloat16" if dtype == "float32" and trainer.mixed_precision else dtype,
    )
    if str(generator.backend) == "vllm":
        generator_setup = replace(generator_setup, batched_tokens=generator.max_num_batched_tokens,
                                  max_seqs=generator.max_num_seqs)
    return model.arch, trainer_setup, generator_setup


def plan_memory(cfg: TrainConfig, headroom: float = DEFAULT_HEADROOM) -> PlanReport:
    """The per-GPU plan of the run's trainer, generators and served verifiers, its time per
    step, and the problems and fixes of a layout that does not fit; `trainer.micro_batch_size=0`
    is derived."""
    arch, t, g = setups_from_cfg(cfg)
    cluster = cfg.cluster
    gib = float(cluster.gpu_memory_gb) if cluster.gpu_memory_gb else None
    per_host = cluster.gpus_per_host or None
    available = per_host * cluster.hosts if per_host else None
    cap = gib * GiB * (1 - headroom) if gib else None
    derived = t.micro_batch_size == 0
    if derived:
        t = replace(t, micro_batch_size=fit_micro_batch(arch, t, cap))
    verifiers = verifier_plans(cfg.reward, cfg.verifier_set, cap)
    set_name = cfg.verifier_set.name
    reward = f"reward={cfg.reward.name or '?'}"
    reward += f" (verifier_set={set_name})" if set_name else ""
    report = PlanReport(
        model=cfg.model.name or "?", arch=arch,
        trainer=trainer_plan(arch, t, cap), generator=generator_plan(arch, g, cap),
        gpus_needed=t.fsdp * t.tp + g.tp * g.replicas + sum(v.gpus for v in verifiers),
        gpus_available=available,
        gpu_memory_gib=gib, headroom=headroom, verifiers=verifiers,
        reward=reward,
        micro_batch_size=t.micro_batch_size, micro_batch_derived=derived,
        time=step_time(param_count(arch), t, g, cluster.gpu_peak_tflops, cluster.mfu, cfg.steps,
                       cfg.sync.mode == "async"),
    )
    report.gpu_memory_utilization = vllm_memory_utilization(report.generator, gib, headroom)
    _diagnose(report, arch, t, g, cap, per_host, available)
    return report


def vllm_memory_utilization(generator: RolePlan, gpu_memory_gib: float | None,
                            headroom: float = DEFAULT_HEADROOM) -> float:
    """vLLM's `gpu_memory_utilization` for the plan: the generator's planned peak over the GPU's
    memory, rounded up to a hundredth, at most the share the headroom leaves (beyond it the plan
    refuses the layout); that share when the GPU's memory is not configured."""
    top = round(1 - headroom, 2)
    if not gpu_memory_gib:
        return top
    return min(top, math.ceil(generator.total_bytes / (gpu_memory_gib * GiB) * 100) / 100)


def check_plan(cfg: TrainConfig, headroom: float = DEFAULT_HEADROOM) -> PlanReport:
    """The launcher's gate: returns the report when the layout fits, raises `PlanError` otherwise."""
    report = plan_memory(cfg, headroom)
    if not report.ok:
        raise PlanError("the configured layout does not fit:\n" + report.table(), report)
    return report


def _diagnose(r: PlanReport, arch: ArchConfig, t: TrainerSetup, g: GeneratorSetup, cap: float | None,
              per_host: int | None, available: int | None) -> None:
    for role, tp in (("trainer_tp", t.tp), ("generator_tp", g.tp)):
        if arch.n_heads % tp or (arch.n_kv_heads % tp and tp % arch.n_kv_heads):
            r.problems.append(f"model.parallelism.{role}={tp} does not divide n_heads={arch.n_heads} / "
                              f"n_kv_heads={arch.n_kv_heads}")
        if per_host and tp > per_host:
            r.problems.append(f"model.parallelism.{role}={tp} spans hosts (cluster.gpus_per_host={per_host}); "
                              f"tensor parallelism needs NVLink, keep it within one host")
    if available is not None and r.gpus_needed > available:
        served = (f" + verifiers {'+'.join(str(v.replicas) for v in r.verifiers)}" if r.verifiers else "")
        r.problems.append(f"the layout needs {r.gpus_needed} GPUs (trainer {t.fsdp}x{t.tp} + generators "
                          f"{g.replicas}x{g.tp}{served}) but the cluster has {available} "
                          f"(cluster.hosts x cluster.gpus_per_host)")
        r.fixes.append("raise cluster.hosts, or lower trainer_fsdp / generator_replicas")
        if r.verifiers:
            r.fixes.extend(_verifier_gpu_fixes(r, arch, t, g, cap, available))
    if cap is not None:
        for v in r.verifiers:
            if not v.fits:
                r.problems.append(f"verifier {v.name!r} ({v.checkpoint}) needs {v.bytes_per_gpu / GiB:.1f} GiB per "
                                  f"GPU, {cap / GiB:.1f} GiB usable")
                r.fixes.append(f"(verifier {v.name}) a smaller checkpoint for it, or GPUs with more memory "
                               f"(a verifier replica holds the whole model on one GPU)")
    if cap is None:
        return
    max_gpus = available or 1024
    if not r.trainer.fits:
        r.problems.append(f"trainer needs {r.trainer.total_bytes / GiB:.1f} GiB per GPU, "
                          f"{cap / GiB:.1f} GiB usable")
        r.fixes.extend(_trainer_fixes(arch, t, cap, max_gpus, per_host or 8))
    if not r.generator.fits:
        r.problems.append(f"each generator GPU needs {r.generator.total_bytes / GiB:.1f} GiB, "
                          f"{cap / GiB:.1f} GiB usable")
        r.fixes.extend(_generator_fixes(arch, g, cap, per_host or 8))


def _verifier_gpu_fixes(r: PlanReport, arch: ArchConfig, t: TrainerSetup, g: GeneratorSetup, cap: float | None,
                        available: int) -> list[str]:
    """Ways to make room for the verifiers' GPUs beside the trainer and the generators."""
    fits = lambda reps: cap is None or generator_plan(arch, replace(g, replicas=reps), cap).fits  # noqa: E731
    fewest = next((n for n in range(1, g.replicas + 1) if fits(n)), g.replicas)  # fewest replicas whose KV fits
    reps = (available - t.fsdp * t.tp - r.verifier_gpus) // g.tp
    if fewest <= reps < g.replicas:
        return [f"(verifiers) lower model.parallelism.generator_replicas to {reps}: the {r.verifier_gpus} verifier "
                f"GPU(s) then fit beside the trainer and the generators"]
    room = max(available - t.fsdp * t.tp - fewest * g.tp, 0)
    single = "" if r.reward.startswith("reward=single_rm") else ", or reward=single_rm (one reward model)"
    return [f"(verifiers) serve fewer of them: the {len(r.verifiers)} served take {r.verifier_gpus} GPU(s), and at "
            f"most {room} fit beside the trainer ({t.fsdp * t.tp}) and {fewest} generator replica(s) (the fewest whose "
            f"KV cache fits; model.parallelism.generator_replicas={fewest}): a verifier_set with fewer reward_model / "
            f"lm_judge members or replicas{single}"]


def _trainer_fixes(arch: ArchConfig, t: TrainerSetup, cap: float, max_gpus: int, per_host: int) -> list[str]:
    fits = lambda s: trainer_plan(arch, s, cap).fits  # noqa: E731
    out = []
    if not t.activation_checkpointing and fits(replace(t, activation_checkpointing=True)):
        out.append("enable activation checkpointing: trainer.activation_checkpointing=true")
    f = t.fsdp * 2
    while f <= 1024 and not fits(replace(t, fsdp=f)):
        f *= 2
    if f <= 1024:
        beyond = f" (the trainer alone then needs {f * t.tp} GPUs: raise cluster.hosts)" if f * t.tp > max_gpus else ""
        out.append(f"raise model.parallelism.trainer_fsdp to {f}{beyond}")
    for tp in (2, 4, 8):
        if tp > t.tp and tp <= per_host and arch.n_kv_heads % tp == 0 and t.fsdp * tp <= max_gpus \
                and fits(replace(t, tp=tp)):
            out.append(f"raise model.parallelism.trainer_tp to {tp}")
            break
    mb = t.micro_batch_size // 2
    while mb >= 1 and not fits(replace(t, micro_batch_size=mb)):
        mb //= 2
    if mb >= 1:
        out.append(f"shrink trainer.micro_batch_size to {mb}")
    if not out:
        out.append("no single knob fits: combine a larger trainer_fsdp/trainer_tp with activation checkpointing, "
                   "or shorten algorithm.max_tokens")
    return ["(trainer) " + o for o in out]


def _generator_fixes(arch: ArchConfig, g: GeneratorSetup, cap: float, per_host: int) -> list[str]:
    fits = lambda s: generator_plan(arch, s, cap).fits  # noqa: E731
    out = []
    for tp in (2, 4, 8):
        if g.tp < tp <= per_host and arch.n_heads % tp == 0 and fits(replace(g, tp=tp)):
            out.append(f"raise model.parallelism.generator_tp to {tp}")
            break
    for reps in (2 * g.replicas, 4 * g.replicas, 8 * g.replicas):
        if fits(replace(g, replicas=reps)):
            out.append(f"raise model.parallelism.generator_replicas to {reps} (fewer sequences per replica)")
            break
    if g.seqs_per_step > 1:
        lo, hi = 1, g.seqs_per_step
        if fits(replace(g, seqs_per_step=1)):
            while lo < hi:  # largest batch that fits
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if fits(replace(g, seqs_per_step=mid)) else (lo, mid - 1)
            out.append(f"shrink the step batch (algorithm.prompts_per_step x group_size) to <= {lo} sequences")
    if not out:
        out.append("the weights alone do not fit: raise model.parallelism.generator_tp")
    return ["(generator) " + o for o in out]


def local_gpus() -> tuple[int, float]:
    """GPUs this machine shows torch, and the smallest one's memory in GiB ((0, 0) without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return 0, 0.0
    n = torch.cuda.device_count()
    return n, min(torch.cuda.get_device_properties(i).total_memory for i in range(n)) / GiB


def check_devices(report: PlanReport | None, cluster: ClusterConfig,
                  have: tuple[int, float] | None = None, argv: list[str] | None = None,
                  needed: int | None = None) -> None:
    """Refuse, before any process starts, a CUDA run whose roles on this machine need GPUs it does
    not have: the plan, what the machine has, and the nearest command that runs here. `needed`: the
    GPUs of the roles this machine (the controller's) hosts (`rlexp.cluster.layout.controller_gpus`:
    every role on a local job, none on a Slurm job whose roles all have hosts of their own, so a
    controller on a login node is not refused); None: the plan's total, on a job kind whose roles
    run here (`local_devices`). `torch.cuda.device_count()` already counts through a scheduler's
    `CUDA_VISIBLE_DEVICES`, which the spawned processes' masks are mapped through
    (`rlexp.core.gpu_mask`). `report` None (the tiny model): GPUs are counted, not their memory."""
    if cluster.device != "cuda":
        return
    if needed is None:
        here = job_backend(cluster.job).local_devices
        needed = (report.gpus_needed if report is not None else 0) if here else 0
    if needed == 0:
        return
    gpus, gib = have if have is not None else local_gpus()
    want_gib = report.gpu_memory_gib if report is not None else None
    if gpus >= needed and (not want_gib or gib >= want_gib * 0.95):
        return
    model = report.model if report is not None else cluster.name
    machine = f"{gpus} GPU(s) of {gib:.0f} GiB" if gpus else "no GPU visible to torch (CPU only)"
    table = f"\n{report.table()}" if report is not None else ""
    raise PlanError(f"model={model} needs {needed} GPUs of {want_gib or '?'} GiB on this machine "
                    f"(cluster={cluster.name}); this machine has {machine} "
                    f"(CUDA_VISIBLE_DEVICES="
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}).{table}\n"
                    f"nearest command that runs here: {nearest_command(argv, gpus)}", report)


def nearest_command(argv: list[str] | None, gpus: int) -> str:
    """The command line minus what needs the GPUs: without GPUs, the CPU demo (the tiny model on its own task)
    with the rest of the choices (reward, algorithm, ...); with some, the same run planned for them."""
    import sys

    from rlexp.config.paths import CONF_DIR
    from rlexp.config.suggest import user_args

    args = user_args(sys.argv[1:] if argv is None else argv)  # never rlexp's own `hydra.searchpath`
    args = [a for a in args if a not in ("train", "plan")]
    if gpus == 0:
        drop = ("model", "cluster", "experiment", "environment", "generator", "trainer", "verifier_set")

        # A group option of the user's own (a task in their config_path) is theirs to keep, with its keys.
        mine = {k for k, _, v in (a.partition("=") for a in args) if k.lstrip("+~") in drop and "." not in k
                and not (CONF_DIR / k.lstrip("+~") / f"{v}.yaml").is_file()}
        mine = {k.lstrip("+~") for k in mine}
        keep = [a for a in args if (group := a.split("=", 1)[0].split(".", 1)[0].lstrip("+~")) not in drop
                or group in mine]
        return "rlexp train " + " ".join(keep) if keep else "rlexp train"
    return (f"rlexp plan {' '.join(args)} cluster.gpus_per_host={gpus} (then lower "
            f"model.parallelism.trainer_fsdp / generator_replicas, or a smaller model, until it fits)")
