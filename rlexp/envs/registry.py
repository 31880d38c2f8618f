"""Builds environments by name. It imports every built-in environment so that `@register_env` has run
before a name is looked up; `base` cannot do this without importing its own subclasses. Add new
modules to the import list below."""
from __future__ import annotations

from rlexp.config.environment import EnvConfig
from rlexp.config.validate import ConfigError, check_options
from rlexp.envs import arithmetic, calculator, gpqa, gsm8k, guess, math_env, mmlu_pro, sort  # noqa: F401
from rlexp.envs.base import _REGISTRY, Environment


def env_names() -> list[str]:
    return sorted(_REGISTRY)


def env_class(name: str) -> type[Environment]:
    if name not in _REGISTRY:
        raise ConfigError(f"unknown environment {name!r}; choose one of {env_names()} (or add a module that "
                          f"uses @register_env, import it in rlexp/envs/registry.py, and add a YAML file in "
                          f"rlexp/conf/environment/)")
    return _REGISTRY[name]


def check_env_options(cfg: EnvConfig) -> None:
    """`environment.options` against the environment's `Options`, without building it (no data is read)."""
    check_options(env_class(cfg.name).Options, cfg.options, f"environment={cfg.name}")


def build_env(cfg: EnvConfig) -> Environment:
    return env_class(cfg.name)(cfg)
