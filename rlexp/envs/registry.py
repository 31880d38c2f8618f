"""Builds environments by name. It imports every built-in environment so that `@register_env` has run
before a name is looked up; `base` cannot do this without importing its own subclasses. A user's environment
is named by import path or listed in `plugins` (`rlexp.core.plugins`), not added here."""
from __future__ import annotations

from rlexp.config.environment import EnvConfig
from rlexp.config.validate import check_options
from rlexp.envs import arithmetic, calculator, gpqa, gsm8k, guess, math_env, mmlu_pro, sort  # noqa: F401
from rlexp.envs.base import ENVIRONMENTS, Environment


def env_names() -> list[str]:
    return ENVIRONMENTS.names()


def env_class(name: str) -> type[Environment]:
    """A built-in name, one a plug-in registered, or `package.module:Class` (`rlexp.registry.Registry.get`)."""
    return ENVIRONMENTS.get(name)


def check_env_options(cfg: EnvConfig) -> None:
    """`environment.options` against the environment's `Options`, without building it (no data is read)."""
    check_options(env_class(cfg.name).Options, cfg.options, f"environment={cfg.name}")


def build_env(cfg: EnvConfig) -> Environment:
    return env_class(cfg.name)(cfg)
