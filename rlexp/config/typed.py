"""The one conversion from Hydra's composed config to the typed `TrainConfig`.

Why one place: Hydra composes a `DictConfig`; everything below the entry points (`rlexp train`'s
`prepare`, `rlexp plan`, the early size check) reads the typed dataclasses, by attribute, with their
types and defaults. Converting in one function means one error message for a value that cannot be
converted, and one answer to "which defaults apply" (the schema's, for a config that does not extend
it, such as a test's partial one). `rlexp.run.prepare.recorded` goes the other way once, for what
the run records.
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlexp.config.schema import TrainConfig
from rlexp.config.validate import ConfigError


def typed_config(composed: DictConfig) -> TrainConfig:
    """`composed` as a `TrainConfig`: merged onto the schema when it does not extend it already
    (every missing value takes the schema's default), interpolations resolved. A value that cannot
    be converted (an unset `${oc.env:...}`, a string where a number belongs) is a `ConfigError`
    naming its key."""
    try:
        if OmegaConf.get_type(composed) is not TrainConfig:
            composed = OmegaConf.merge(OmegaConf.structured(TrainConfig), composed)
        cfg = OmegaConf.to_object(composed)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"{key}: {str(e).splitlines()[0]}") from None
    assert isinstance(cfg, TrainConfig)
    return cfg
