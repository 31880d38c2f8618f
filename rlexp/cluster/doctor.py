"""`rlexp doctor [overrides]`: is this machine ready for the run these overrides compose? Prints torch's version and
the CUDA it is built for, the NVIDIA driver (NVML or nvidia-smi, when present), the GPUs torch sees (after
CUDA_VISIBLE_DEVICES) and each role's GPUs for the composed config; refuses a driver too old for the torch build, a
CUDA run without a GPU, and a layout that needs more GPUs than are visible. Takes the same overrides as `rlexp train`.

Exit codes: 0 ready (a CPU run: "no CUDA; CPU run"), 1 refused (the message says what to change), 2 config error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlexp.config.paths import CONF_DIR
from rlexp.core.plugins import with_config_path

if TYPE_CHECKING:  # imported by `rlexp doctor` before anything heavy
    from rlexp.config.schema import TrainConfig


def _physical(mask: list[str], index: str) -> str:
    return mask[int(index)] if int(index) < len(mask) else "?"


def role_lines(cfg: TrainConfig, visible: str | None) -> list[str]:
    """Each role's GPUs, as `rlexp train` will mask them (indices within CUDA_VISIBLE_DEVICES when one is set)."""
    from rlexp.cluster.layout import gpu_layout

    layout, used = gpu_layout(cfg)
    mask = visible.split(",") if visible else None
    lines = []
    for role, per_rank in layout.items():
        shown = [f"{g} (physical {','.join(_physical(mask, i) for i in g.split(','))})" if mask else g
                 for g in per_rank]
        lines.append(f"  {role}: " + ", ".join(f"rank {r} -> GPU {g}" for r, g in enumerate(shown)))
    if cfg.algorithm.kl_coef > 0:
        lines.append("  reference: on the trainer's GPUs (algorithm.kl_coef > 0)")
    lines.append("hosts: " + ", ".join(f"{h} {n} GPUs" for h, n in used.items()))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlexp doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=qwen3_8b cluster=gpu_node")
    p.add_argument("--config-dir", type=Path, default=CONF_DIR)
    p.add_argument("--config-name", default="train")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from rlexp.cluster.cuda_env import check_cuda, describe, query_cuda
    from rlexp.cluster.layout import gpus_needed
    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.config.typed import typed_config
    from rlexp.config.validate import ConfigError

    facts = query_cuda()
    print("\n".join(describe(facts)))
    try:
        cfg = typed_config(compose_run_config(with_config_path(args.overrides), args.config_dir,
                                              args.config_name))
    except Exception as e:  # Hydra composition errors name the bad override themselves
        print(f"rlexp doctor: cannot compose the run config: {e}", file=sys.stderr)
        return 2
    if cfg.cluster.device != "cuda":
        print(f"cluster={cfg.cluster.name}: no CUDA; CPU run")
        return 0
    print(f"cluster={cfg.cluster.name}, model={cfg.model.name}: each role's GPUs")
    print("\n".join(role_lines(cfg, facts.visible_devices)))
    try:
        check_cuda(facts, gpus_needed(cfg))
    except ConfigError as e:
        print(f"refused: {e}", file=sys.stderr)
        return 1
    print("ready: `rlexp plan` with the same overrides checks the memory")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
