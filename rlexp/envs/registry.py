"""Builds environments by name. It imports every built-in environment so that `@register_env` has run
before a name is looked up; `base` cannot do this without importing its own subclasses. Add new
modules to the import list below."""
from __future__ import annotations

from rlexp.config.environment import EnvConfig
from rlexp.envs import arithmetic, calculator, gpqa, gsm8k, guess, math_env, mmlu_pro, sort  # noqa: F401
from rlexp.envs.base import _REGISTRY, Environment


def env_names() -> list[str]:
    return sorted(_REGISTRY)


def build_env(cfg: EnvConfig) -> Environment:
    if cfg.name not in _REGISTRY:
        raise ValueError(f"unknown environment {cfg.name!r}; choose one of {env_names()} (or add a module that "
                         f"uses @register_env, import it in rlexp/envs/registry.py, and add a YAML file in "
                         f"rlexp/conf/environment/)")
    return _REGISTRY[cfg.name](cfg)
