"""Builds verifiers from config. It imports every built-in implementation so that `@register_rule` has
run before a rule name is looked up; `base` cannot, since the implementations import it. A user's rule is named
by import path (`options.rule: package.module:Class`) or registered by a module listed in `plugins`."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from rlexp.config.model import ModelConfig
from rlexp.config.reward import VerifierConfig
from rlexp.rewards.base import plain
from rlexp.rewards.verifiers import arithmetic  # noqa: F401  (registers the arithmetic rules)
from rlexp.rewards.verifiers.base import ServedVerifier, Verifier
from rlexp.rewards.verifiers.kinds import (  # noqa: F401  (re-exports build_rule, rule_names)
    RESERVED_OPTIONS,
    build_rule,
    is_served,
    kind_of,
    kind_options,
    rule_names,
)


def build_verifier(cfg: VerifierConfig | dict[str, Any], env: Any = None, *, served: bool = True,
                   device: str = "cpu") -> Verifier:
    """One verifier from its config (a dataclass, an OmegaConf node or a plain dict).

    `served=True` (inside a run) turns a model verifier into a stand-in scored by its own service;
    `served=False` loads the model in this process (the verifier's service itself, `rlexp eval`, tests).
    `env` is needed by the kinds that read answers (`format`, `majority`) and picks the judge template."""
    cfg = plain(cfg)
    if isinstance(cfg, dict):
        cfg = VerifierConfig(**cfg)
    options = dict(plain(cfg.options) or {})
    kind = kind_of(cfg)  # registered or package.module:Class; an unknown one names close matches
    name = cfg.name or str(options.get("rule", kind.name or cfg.kind))
    if kind.model and served and is_served(cfg):
        return ServedVerifier(name, str(cfg.kind), cfg)
    typed = kind_options(kind, options, f"verifier {name!r} (kind {cfg.kind})")
    return kind.build(name, typed, env, device)


def verifier_checkpoint(v: VerifierConfig) -> VerifierConfig:
    """`v` with `options.path` set to its checkpoint folder; `tiny` builds a stand-in, `hf_repo` reads the
    Hugging Face cache and never downloads (the error gives the command)."""
    from rlexp.models.hf_files import CheckpointError, find_checkpoint

    v = VerifierConfig(**v) if isinstance(v, dict) else v
    o = dict(v.options)
    if "tiny" in o:
        # torch (a stand-in is trained on first use): imported only here
        from rlexp.rewards.verifiers.tiny import ensure_tiny_verifier
        from rlexp.rewards.verifiers.tiny_panels import TINY_VERIFIERS

        name = o.pop("tiny")
        if name not in TINY_VERIFIERS:
            raise ValueError(f"verifier {v.name!r}: options.tiny={name!r} is not a tiny verifier; choose one of "
                              f"{sorted(TINY_VERIFIERS)}")
        o["path"] = str(ensure_tiny_verifier(TINY_VERIFIERS[name]))
    elif "hf_repo" in o:
        repo, revision = o.pop("hf_repo"), str(o.pop("revision", "main"))
        try:
            o["path"] = str(find_checkpoint(ModelConfig(name=v.name, hf_repo=repo, revision=revision)))
        except CheckpointError as e:
            msg = str(e).replace("set model.path to a local folder", f"set options.path of verifier {v.name}")
            raise CheckpointError(f"verifier {v.name!r} ({v.kind}): {msg}") from None
    elif not o.get("path") or not Path(str(o["path"])).expanduser().is_dir():
        raise CheckpointError(f"verifier {v.name!r} ({v.kind}): options.path={o.get('path')!r} is not a folder; give "
                              f"`path` (a local Hugging Face folder), `hf_repo` + `revision`, or `tiny`")
    return replace(v, options=o)
