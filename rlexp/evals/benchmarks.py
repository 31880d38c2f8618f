"""Benchmarks: an environment config (its eval split is scored) plus a generation budget, one file per
benchmark in conf/benchmark/. Shared by `rlexp eval` and by evaluation during training."""
from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.config.environment import EnvConfig
from rlexp.config.paths import CONF_DIR
from rlexp.envs.base import Environment
from rlexp.envs.registry import build_env


def env_config(d: Any) -> EnvConfig:
    """An EnvConfig from a YAML mapping (typed: unknown keys fail here, not deep in a loader)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EnvConfig), d))  # type: ignore[return-value]


def benchmark_envs(cfg: DictConfig) -> dict[str, tuple[Environment, int]]:
    """name -> (environment, max_tokens) for every benchmark selected in the `benchmark` group."""
    out = {}
    for name, spec in cfg.benchmark.items():
        env = build_env(env_config(spec.environment))
        out[str(name)] = (env, int(cfg.max_tokens or spec.get("max_tokens", 1024)))
    return out


def load_benchmarks(names: list[str]) -> dict[str, tuple[Environment, int]]:
    """`eval.benchmarks` of a training run, with their data loaded now: missing data fails before spawning.
    The files are read directly: Hydra's compose API cannot run inside the running train app."""
    out: dict[str, tuple[Environment, int]] = {}
    for name in names:
        path = CONF_DIR / "benchmark" / f"{name}.yaml"
        if not path.exists():
            choices = sorted(p.stem for p in path.parent.glob("*.yaml"))
            raise ValueError(f"eval.benchmarks: unknown benchmark {name!r}; choose from {choices}")
        parts = [n for n in OmegaConf.load(path).get("defaults", []) if n != "_self_"] or [name]  # e.g. all.yaml
        bench = OmegaConf.merge(*[OmegaConf.load(path.parent / f"{n}.yaml") for n in parts])
        out.update(benchmark_envs(OmegaConf.create({"benchmark": bench, "max_tokens": None})))
    for env, _ in out.values():
        env.eval_samples()
    return out
