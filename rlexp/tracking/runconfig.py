"""A run's config as the manifest records it: resolved to plain values, and hashed without the keys that say
*where* a run lives (paths, run dirs, logger settings), so two runs of the same experiment get the same
`config_sha256` wherever and however they were logged."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .files import sha256_json
from .redact import redact

# Top-level config keys (and key names anywhere) that describe *where* a run lives, not *what* it computes.
RUN_LOCAL_TOP_KEYS = frozenset({"hydra", "paths", "logger", "run_dir", "output_dir", "runs_root"})
RUN_LOCAL_ANY_KEYS = frozenset({"run_dir", "output_dir", "log_dir", "save_dir", "work_dir", "runs_root"})


def config_to_container(cfg: DictConfig | Mapping[str, Any] | None) -> dict[str, Any]:
    if cfg is None:
        return {}
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True, throw_on_missing=False)  # type: ignore[return-value]
    return dict(cfg)


def _strip_run_local(tree: Any, top: bool = True) -> Any:
    if isinstance(tree, Mapping):
        drop = RUN_LOCAL_TOP_KEYS if top else frozenset()
        return {k: _strip_run_local(v, False) for k, v in tree.items() if k not in drop and k not in RUN_LOCAL_ANY_KEYS}
    if isinstance(tree, list):
        return [_strip_run_local(v, False) for v in tree]
    return tree


def config_hash(cfg: DictConfig | Mapping[str, Any]) -> str:
    """sha256 of the resolved, redacted config minus run-local keys: equal hash <=> same experiment (a rotated
    token or a different password in a URL does not change it)."""
    return sha256_json(_strip_run_local(redact(config_to_container(cfg))))

