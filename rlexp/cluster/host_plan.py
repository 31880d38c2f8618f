"""Host memory and process count, planned before anything spawns, as `rlexp.cluster.planner` plans GPU memory.

A size a machine cannot hold (`algorithm.group_size=1000000`, `algorithm.prompts_per_step=100000000`,
`generator.replicas=64`) used to grow to gigabytes or dozens of processes before anything stopped it. Here the
sizes give an estimate of this host's RAM and processes, checked against the machine in well under a second,
and a refusal names the key to lower and the largest value that fits.

What runs on this host: the controller always; with a job whose hosts are processes of this machine
(`one_machine`: cluster=local, cluster=process) every actor process too, and on CPU their tensors. Each figure
is a **floor** per token and per process (what the run holds at least), at the lengths the GPU planner sizes
for (`algorithm.max_prompt_tokens + algorithm.max_tokens`, cut to the context), against 90% of the machine's
RAM: a refusal is a run that cannot fit, not a guess. A run under the budget may still be tight, and one above
the memory available right now (other work) is warned about, not refused:

* a process: `PROCESS_MIB`, measured here: the unique memory (USS, psutil) of a Python process that has
  imported what a Monarch actor process imports (torch, monarch.actor, rlexp's generator and trainer actors):
  RSS 574 MiB, of which 248 MiB shared libraries (`SHARED_MIB`, counted once), USS 326 MiB (2 CPUs,
  24 GiB, torch 2.x CPU). studies/scaling/results/scaling_cpu.md measured 540-616 MiB peak RSS for working actors of the
  smallest configs, consistent with it;
* the step's rollouts in the controller: per sample a record (`ROW_BYTES`), a Python list of token ids
  (8 bytes a token) and response logprobs (a float object and its pointer, 32 bytes a token); on a local
  trainer their tensors again (16 bytes a token);
* on CPU with local actors: the trainer's fp32 weights, gradients and two AdamW moments (16 bytes a
  parameter, one more copy for the KL reference), one micro-batch's logits and their log-softmax per rank
  (`vocab * 8` bytes a token), each generator's weights and, for `generator.backend=titan`, the KV cache of
  at least one prompt's group (the backend batches equal-length prompts); `vllm` reserves `kv_cache_gb`.

Processes: more than `PROCS_PER_CPU` per core on this host is refused (Monarch's heartbeats and the hang
detector's deadlines assume a process gets a core now and then).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

from omegaconf import DictConfig

from rlexp.config.schema import TrainConfig
from rlexp.config.typed import typed_config
from rlexp.config.validate import ConfigError

MIB = 2**20
PROCESS_MIB = 320  # unique memory of one actor process at rest (USS 326 MiB measured, see above)
SHARED_MIB = 240  # shared libraries (torch, monarch), mapped once per machine (248 MiB measured)
ROW_BYTES = 1024  # one rollout record in the controller: a dict, its strings, reward and advantage
PROCS_PER_CPU = 8
BUDGET_FRACTION = 0.9  # of total RAM: the kernel, page cache and the shell keep the rest
# Keys a refusal may suggest lowering: config key, `Sizes` field, the smallest value it can take.
TUNABLE: tuple[tuple[str, str, int], ...] = (
    ("algorithm.group_size", "group_size", 2), ("algorithm.prompts_per_step", "prompts_per_step", 1),
    ("algorithm.max_tokens", "max_tokens", 1), ("generator.replicas", "replicas", 1),
    ("trainer.micro_batch_size", "micro_batch_size", 1), ("reward.replicas", "reward_replicas", 1),
)


class HostPlanError(ConfigError):
    """The sizes do not fit this host; the message names the key to lower and by how much."""


@dataclass(frozen=True)
class Sizes:
    """The numbers the estimate reads, flat, so a refusal can try other values of one key."""
    group_size: int
    prompts_per_step: int
    max_tokens: int
    max_prompt_tokens: int
    max_seq_len: int
    replicas: int
    generator_tp: int
    trainer_world: int
    reward_replicas: int
    micro_batch_size: int
    vocab: int
    params: int
    layers: int
    kv_dim: int  # n_kv_heads * head_dim
    kl: bool
    cpu: bool  # tensors in host memory
    local_actors: bool  # actor processes on this machine
    vllm_kv_gb: float | None  # generator.backend=vllm: its KV reservation per replica; None for titan


def param_count(arch: Any) -> int:
    """Parameters of a Qwen3-shaped model (embeddings, attention, SwiGLU feed-forward; norms ignored)."""
    attn = arch.dim * arch.head_dim * (2 * arch.n_heads + 2 * arch.n_kv_heads)
    ffn = 3 * arch.dim * arch.hidden_dim
    emb = arch.vocab_size * arch.dim * (1 if arch.tie_embeddings else 2)
    return int(emb + arch.n_layers * (attn + ffn))


def sizes_of(cfg: TrainConfig, one_machine: bool) -> Sizes:
    """The estimate's numbers from the typed run config."""
    a, arch, g, par = cfg.algorithm, cfg.model.arch, cfg.generator, cfg.model.parallelism
    vllm = str(getattr(g.backend, "value", g.backend)) == "vllm"
    return Sizes(
        group_size=a.group_size, prompts_per_step=a.prompts_per_step, max_tokens=a.max_tokens,
        max_prompt_tokens=a.max_prompt_tokens, max_seq_len=arch.max_seq_len, replicas=g.replicas,
        generator_tp=g.tp if vllm else 1, trainer_world=par.trainer_fsdp * par.trainer_tp,
        reward_replicas=cfg.reward.replicas, micro_batch_size=cfg.trainer.micro_batch_size, vocab=arch.vocab_size,
        params=param_count(arch), layers=arch.n_layers, kv_dim=arch.n_kv_heads * arch.head_dim,
        kl=a.kl_coef > 0, cpu=str(getattr(cfg.cluster.device, "value", cfg.cluster.device)) == "cpu",
        local_actors=one_machine, vllm_kv_gb=float(g.kv_cache_gb) if vllm else None)


@dataclass
class HostPlan:
    processes: dict[str, int]
    items: dict[str, float]  # what -> bytes on this host (floors)

    @property
    def total_bytes(self) -> float:
        return sum(self.items.values())

    @property
    def n_processes(self) -> int:
        return sum(self.processes.values())

    def line(self) -> str:
        """One line for `rlexp plan` and errors: the total, its largest parts, the processes."""
        parts = sorted(self.items.items(), key=lambda kv: -kv[1])[:3]
        return (f"host: at least {_gib(self.total_bytes)} RAM ("
                + ", ".join(f"{k} {_gib(v)}" for k, v in parts) + f"), {self.n_processes} processes ("
                + ", ".join(f"{k} {n}" for k, n in self.processes.items() if n) + ")")


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b < 2**40 else f"{b / 2**40:.3g} TiB"


def estimate(s: Sizes) -> HostPlan:
    """This host's processes and memory floors for one step (see the module docstring for each figure)."""
    samples = s.group_size * s.prompts_per_step
    seq = min(s.max_prompt_tokens + s.max_tokens, s.max_seq_len)
    resp = min(s.max_tokens, s.max_seq_len)
    procs = {"controller": 1}
    if s.local_actors:
        procs.update(generator=s.replicas * s.generator_tp, trainer=s.trainer_world, reward=s.reward_replicas)
    n = sum(procs.values())
    items: dict[str, float] = {
        "processes": n * PROCESS_MIB * MIB + SHARED_MIB * MIB,
        "rollouts": samples * (ROW_BYTES + 8.0 * seq + 32.0 * resp),
    }
    if s.local_actors and s.cpu:
        rows = min(s.micro_batch_size, math.ceil(samples / s.trainer_world))
        items["trainer batch"] = samples * seq * 16.0
        items["trainer state"] = s.params * (16.0 + (4.0 if s.kl else 0.0))
        items["trainer logits"] = s.trainer_world * rows * seq * s.vocab * 8.0
        items["generator weights"] = s.replicas * s.params * 4.0
        kv = (s.replicas * s.vllm_kv_gb * 2**30 if s.vllm_kv_gb is not None
              else s.replicas * s.group_size * seq * s.layers * 2 * s.kv_dim * 4.0)
        items["generator KV cache"] = kv
    return HostPlan(procs, items)


def largest_fitting(s: Sizes, name: str, lo: int, fits: Any) -> int | None:
    """The largest value of the field `name` (at most its current one) whose estimate `fits`; None when even
    `lo` does not."""
    if not fits(estimate(replace(s, **{name: lo}))):
        return None
    hi = int(getattr(s, name))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(estimate(replace(s, **{name: mid}))) else (lo, mid - 1)
    return lo


def machine() -> tuple[float, float, int]:
    """(total RAM bytes, available RAM bytes, CPUs) of this host."""
    import psutil

    vm = psutil.virtual_memory()
    return float(vm.total), float(vm.available), os.cpu_count() or 1


def check_host(s: Sizes, have: tuple[float, float, int] | None = None) -> HostPlan:
    """Refuse what cannot fit this host (HostPlanError naming the key to lower and the largest value that fits);
    return the plan, with a printed warning when it exceeds the memory available right now."""
    total, available, cpus = have or machine()
    plan = estimate(s)
    budget, max_procs = BUDGET_FRACTION * total, PROCS_PER_CPU * cpus

    def fits(p: HostPlan) -> bool:
        return p.total_bytes <= budget and p.n_processes <= max_procs

    if fits(plan):
        if plan.total_bytes > available:
            print(f"[rlexp] warning: {plan.line()}; only {_gib(available)} is available now (other work): the "
                  "run may be slow or be killed for memory", flush=True)
        return plan
    why = []
    if plan.total_bytes > budget:
        why.append(f"needs at least {_gib(plan.total_bytes)} of RAM, more than {BUDGET_FRACTION:.0%} of this "
                   f"machine's {_gib(total)}")
    if plan.n_processes > max_procs:
        why.append(f"starts {plan.n_processes} processes on this host, more than {PROCS_PER_CPU} per CPU "
                   f"({cpus} CPUs)")
    fixes = []
    for key, name, lo in TUNABLE:
        best = largest_fitting(s, name, lo, fits)
        if best is not None and best < getattr(s, name):
            fixes.append(f"{key}={getattr(s, name)} -> at most {best}")
    fix = ("lower one of: " + "; ".join(fixes)) if fixes else "no single size fits: lower several, or use a " \
        "cluster whose actors run on other hosts (cluster=slurm, cluster=kubernetes)"
    raise HostPlanError(f"this run {' and '.join(why)}: {plan.line()}. {fix}")


def check_context(cfg: TrainConfig) -> None:
    """Token budgets beyond the model's context, refused naming both values (a response can never be longer
    than the context: the generator would cut every one, the planner would size for tokens that never exist)."""
    limit = int(cfg.model.arch.max_seq_len)
    for key, v in (("algorithm.max_tokens", cfg.algorithm.max_tokens),
                   ("algorithm.max_prompt_tokens", cfg.algorithm.max_prompt_tokens),
                   ("eval.max_tokens", cfg.eval.max_tokens)):
        if v is not None and int(v) >= limit:
            raise HostPlanError(f"{key}={v} is beyond model={cfg.model.name}'s context, model.arch.max_seq_len="
                                f"{limit} tokens (prompt and response together); set {key} below {limit}")


def host_line(cfg: TrainConfig) -> str:
    """`rlexp plan`'s line for this host: the estimate, or why it does not fit ("" when it cannot be read)."""
    from rlexp.cluster.registry import JOBS

    try:
        job = JOBS.find(str(cfg.cluster.job))
        plan = check_host(sizes_of(cfg, bool(job and job.one_machine)))
    except HostPlanError as e:
        return f"refused: {e}"
    except Exception:  # an unreadable size: `rlexp train` names it at validation
        return ""
    return plan.line()


def check_sizes(composed: DictConfig) -> None:
    """`check_context` and `check_host` on the composed config, before torch and Monarch load
    (`rlexp train` calls it first, so a size this machine cannot hold is refused in a second or two,
    not after the imports). A config these numbers cannot be read from (an unresolved interpolation,
    a value not yet validated, a job kind from a plug-in) is left to
    `rlexp.run.prepare.check_config`, which checks the same after validation. The composed config is
    made typed here by the same conversion `prepare` runs (`rlexp.config.typed.typed_config`): this
    check is the one that cannot wait for `prepare`."""
    from rlexp.cluster.registry import JOBS

    try:
        cfg = typed_config(composed)
        job = JOBS.find(str(cfg.cluster.job))
        s = sizes_of(cfg, bool(job and job.one_machine))
    except (AttributeError, TypeError, ValueError):  # ConfigError is a ValueError
        return
    if job is None or min(s.group_size, s.prompts_per_step, s.max_tokens, s.replicas, s.generator_tp,
                          s.trainer_world, s.reward_replicas, s.micro_batch_size, s.max_seq_len) < 1:
        return
    check_context(cfg)
    check_host(s)
