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
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlexp.cluster.layout import check_hosts_fit, gpu_layout
from rlexp.cluster.planner import DEFAULT_HEADROOM, PlanError, plan_memory
from rlexp.config.paths import CONF_DIR
from rlexp.config.validate import ConfigError, too_big_for_cpu
from rlexp.core.plugins import with_config_path  # `config_path=DIR`: a user's own config folders, as in `rlexp train`


def compose_run_config(overrides: list[str], config_dir: Path = CONF_DIR, config_name: str = "train") -> Any:
    """Compose `<config_dir>/<config_name>.yaml` (default rlexp/conf/train.yaml) with Hydra's compose API
    (no working-dir change, no logging)."""
    from hydra import compose, initialize_config_dir

    from rlexp.config.schema import register_configs

    register_configs()  # the typed schemas (train_schema, ...) the YAML defaults lists extend
    if not (Path(config_dir) / f"{config_name}.yaml").exists():
        raise FileNotFoundError(f"{Path(config_dir) / (config_name + '.yaml')} not found")
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def print_hosts(cfg: Any) -> bool:
    """GPUs per host (roles with hosts of their own number theirs from 0); False when a host cannot hold its roles
    or a tensor-parallel group would span hosts."""
    try:
        typed = OmegaConf.to_object(cfg)
        _, used = gpu_layout(typed)
    except Exception:  # a config without the train schema's cluster: the memory plan above is all there is
        return True
    if not used:
        return True
    per_host = typed.cluster.gpus_per_host
    print("\nhosts: " + ", ".join(f"{h} {n}/{per_host or '?'} GPUs" for h, n in used.items()))
    try:
        check_hosts_fit(typed)
    except ConfigError as e:
        print(f"problem: {e}")
        return False
    return True


def print_weight_sync(cfg: Any) -> None:
    """The time of one weight sync, trainer to generators (`rlexp.cluster.weight_sync`)."""
    from rlexp.cluster.hosts import weight_hosts
    from rlexp.cluster.planner import setups_from_cfg
    from rlexp.cluster.weight_sync import weight_sync
    from rlexp.models.catalog import param_count

    try:
        typed = OmegaConf.to_object(cfg)
        arch, _, g = setups_from_cfg(cfg)
        est = weight_sync(param_count(arch), {"float32": 4}.get(g.dtype, 2), g.replicas,
                          weight_hosts(typed.cluster) > 1, typed.cluster.network_gbps)
    except Exception:  # a config without the train schema's cluster: the memory plan above is all there is
        return
    print("\n" + est.line(g.dtype))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlexp plan", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=qwen3_8b cluster=local")
    p.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM, help="fraction of GPU memory kept free")
    p.add_argument("--config-dir", type=Path, default=CONF_DIR)
    p.add_argument("--config-name", default="train")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = compose_run_config(with_config_path(args.overrides), args.config_dir, args.config_name)
        report = plan_memory(cfg, args.headroom)
    except PlanError as e:
        print(f"rlexp plan: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Hydra composition errors name the bad override themselves
        print(f"rlexp plan: cannot compose the run config: {e}", file=sys.stderr)
        return 2
    print(report.table())
    if too_big_for_cpu(cfg):
        print(f"\nrefused: model={cfg.model.name} needs GPUs, but cluster={cfg.cluster.name} is CPU-only "
              f"(cluster.device=cpu), so rlexp train would refuse it. Leave cluster= out (the model brings its GPU "
              f"cluster) or name one with GPUs: cluster=gpu_node, cluster=slurm", file=sys.stderr)
        return 1
    hosts_ok = print_hosts(cfg)
    print_weight_sync(cfg)
    if not report.ok or not hosts_ok:
        print("\nrefused: the layout does not fit (see 'fix:' lines)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
