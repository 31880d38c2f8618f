"""`rlexp train`: the Hydra task function. Returns final held-out accuracy (what sweepers optimise)."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlexp import runlock
from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import register_configs
from rlexp.errors import friendly_errors

register_configs()


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def train(cfg: DictConfig) -> float:
    # The run folder's lock first: a second process on a live folder is refused before torch loads.
    with friendly_errors(), runlock.hold(Path(HydraConfig.get().runtime.output_dir)):
        # Imported here, not at the top: `rlexp train --help`, composition errors and a busy run folder must
        # not wait for torch and Monarch to load.
        from rlexp.launcher import run

        final = run(cfg)
    return float(final.get("eval/accuracy", float("nan")))


def main(argv: list[str]) -> int:
    sys.argv = ["rlexp train", *argv]
    train()
    return 0
