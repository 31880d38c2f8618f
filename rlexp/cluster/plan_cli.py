"""`rlexp plan model=qwen3_8b cluster=...`: print the per-GPU memory plan of a run config and say
whether it fits, without starting anything. Takes the same overrides as `rlexp train`.

Counts every mesh the run spawns on GPUs: the trainer, the generators, and the model verifiers the reward
serves (reward=weaver / verifier_mean / verifier_vote: every reward_model and lm_judge of `verifier_set`;
single_rm: the one it picks), one GPU per verifier replica at the set's `memory_gb`.

User config folders (`config_path=DIR` or `config_path=[DIR,...]`) are searched as `rlexp train` searches them.

Exit codes: 0 fits, 1 does not fit (the table ends with what to change; also a real model on a CPU-only
cluster), 2 config error.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

from omegaconf import DictConfig

from rlexp.cluster import gpu_hours
from rlexp.cluster.host_plan import host_line
from rlexp.cluster.layout import check_hosts_fit, gpu_layout, gpu_placement
from rlexp.cluster.planner import DEFAULT_HEADROOM, PlanError, PlanReport, plan_memory
from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import TrainConfig
from rlexp.config.typed import typed_config
from rlexp.config.validate import ConfigError, too_big_for_cpu
from rlexp.core.gpu_mask import MaskError, through_mask
from rlexp.core.plugins import with_config_path  # `config_path=DIR`: a user's own config folders, as in `rlexp train`


def compose_run_config(overrides: list[str], config_dir: Path = CONF_DIR,
                       config_name: str = "train") -> DictConfig:
    """Compose `<config_dir>/<config_name>.yaml` (default conf/train.yaml) with Hydra's compose API
    (no working-dir change, no logging)."""
    from hydra import compose, initialize_config_dir

    from rlexp.config.schema import register_configs

    register_configs()  # the typed schemas (train_schema, ...) the YAML defaults lists extend
    if not (Path(config_dir) / f"{config_name}.yaml").exists():
        raise FileNotFoundError(f"{Path(config_dir) / (config_name + '.yaml')} not found")
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def print_hosts(cfg: TrainConfig) -> bool:
    """GPUs per host (roles with hosts of their own number theirs from 0); False when a host cannot
    hold its roles or a tensor-parallel group would span hosts."""
    try:
        _, used = gpu_layout(cfg)
    except ValueError:  # a job kind rlexp cannot find: `rlexp train` refuses it, listing the kinds
        return True
    if not used:
        return True
    per_host = cfg.cluster.gpus_per_host
    print("\nhosts: " + ", ".join(f"{h} {n}/{per_host or '?'} GPUs" for h, n in used.items()))
    print(role_devices(cfg))
    try:
        check_hosts_fit(cfg)
    except ConfigError as e:
        print(f"problem: {e}")
        return False
    return True


def role_devices(cfg: TrainConfig, mask: str | None = None) -> str:
    """Each mesh's GPUs per rank as `host:GPUs` (rlexp's indices, counted from 0 on each host); on
    this machine's host through its `CUDA_VISIBLE_DEVICES` (`mask`, default this process's), as each
    process will get them at spawn (`rlexp.core.gpu_mask`)."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES") if mask is None else mask
    place, _ = gpu_placement(cfg)

    def where(host: str, gpus: str) -> str:
        if host != "local" or mask is None:
            return f"{host}:{gpus}"
        try:
            return f"{host}:{gpus}(=GPU {through_mask(gpus, mask)})"
        except MaskError:
            return f"{host}:{gpus}(beyond CUDA_VISIBLE_DEVICES={mask})"

    return "devices: " + "; ".join(f"{mesh} " + " ".join(where(h, g) for h, g in ranks)
                                   for mesh, ranks in place.items())


def print_checkpoint_limits(cfg: TrainConfig) -> bool:
    """The checkpoint's own limits when it is on this machine (`rlexp.models.limits`), what
    `rlexp train` checks before spawning; False when they refuse the run. The limits may lower
    `model.arch.max_seq_len` in a copy: the plan printed above is of the config as given."""
    if cfg.model.flavor == "tiny" and not cfg.model.path:
        return True
    from rlexp.models.limits import LimitError, apply_limits, cached_limits

    model = copy.deepcopy(cfg.model)
    limits = cached_limits(model)
    if limits is None:
        print(f"\ncheckpoint: {model.hf_repo or model.path} is not on this machine; `rlexp train` "
              f"checks its config.json (max_position_embeddings, RoPE, vocabulary) before spawning")
        return True
    print(f"\ncheckpoint: max_position_embeddings {limits.max_positions}, vocab_size "
          f"{limits.vocab_size}, rope_theta {limits.rope_theta}, rope_scaling "
          f"{limits.rope_scaling} ({limits.source})")
    algo = cfg.algorithm
    try:
        for note in apply_limits(model, limits, algo.max_prompt_tokens, algo.max_tokens):
            print(f"note: {note}")
    except LimitError as e:
        print(f"problem: {e}")
        return False
    return True


def print_weight_sync(cfg: TrainConfig) -> None:
    """The time of one weight sync, trainer to generators (`rlexp.cluster.weight_sync`)."""
    from rlexp.cluster.hosts import weight_hosts
    from rlexp.cluster.planner import setups_from_cfg
    from rlexp.cluster.weight_sync import weight_sync
    from rlexp.models.catalog import param_count

    arch, _, generator = setups_from_cfg(cfg)
    try:
        hosts = weight_hosts(cfg.cluster)
    except ValueError:  # a job kind rlexp cannot find: `rlexp train` refuses it, listing the kinds
        return
    est = weight_sync(param_count(arch), {"float32": 4}.get(generator.dtype, 2), generator.replicas,
                      hosts > 1, cfg.cluster.network_gbps)
    print("\n" + est.line(generator.dtype))


def plan_sweep(name: str, overrides: list[str], args: argparse.Namespace) -> int:
    """`rlexp plan ... +sweeps=NAME`: one line per run (GPUs, hours, whether it fits) and the total GPU-hours."""
    def plan(run: list[str]) -> tuple[TrainConfig, PlanReport]:
        cfg = typed_config(compose_run_config(run, args.config_dir, args.config_name))
        return cfg, plan_memory(cfg, args.headroom)

    lines, ok = gpu_hours.plan_sweep(name, overrides, plan)
    print("\n".join(lines))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlexp plan", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=qwen3_8b cluster=local")
    p.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM, help="fraction of GPU memory kept free")
    p.add_argument("--config-dir", type=Path, default=CONF_DIR)
    p.add_argument("--config-name", default="train")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        overrides, sweep = gpu_hours.take_sweep(with_config_path(args.overrides))
        if sweep is not None:  # `+sweeps=NAME`: every run of the preset, and the sweep's GPU-hours
            return plan_sweep(sweep, overrides, args)
        composed = compose_run_config(overrides, args.config_dir, args.config_name)
        cfg = typed_config(composed)  # the one conversion: everything below reads the typed config
        report = plan_memory(cfg, args.headroom)
    except gpu_hours.SweepError as e:
        print(e, file=sys.stderr)
        return 2
    except (PlanError, ConfigError) as e:
        print(f"rlexp plan: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Hydra composition errors name the bad override themselves
        print(f"rlexp plan: cannot compose the run config: {e}", file=sys.stderr)
        return 2
    print(report.table())
    limits_ok = print_checkpoint_limits(cfg)
    host = host_line(cfg)  # this host's RAM and processes (rlexp.cluster.host_plan)
    if host:
        print(f"\n{host}", file=sys.stderr if host.startswith("refused") else sys.stdout)
    if too_big_for_cpu(cfg):
        print(f"\nrefused: model={cfg.model.name} needs GPUs, but cluster={cfg.cluster.name} is CPU-only "
              f"(cluster.device=cpu), so rlexp train would refuse it. Leave cluster= out (the model brings its GPU "
              f"cluster) or name one with GPUs: cluster=gpu_node, cluster=slurm", file=sys.stderr)
        return 1
    hosts_ok = print_hosts(cfg) and not host.startswith("refused")
    print_weight_sync(cfg)
    print("\n" + gpu_hours.cost_line(gpu_hours.run_cost(cfg, report)))
    if not report.ok or not hosts_ok or not limits_ok:
        print("\nrefused: the layout does not fit (see 'fix:' lines)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
