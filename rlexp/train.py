"""`rlexp train`: the Hydra task function. Returns final held-out accuracy (what sweepers optimise)."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from rlexp.config.schema import register_configs

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
register_configs()


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def train(cfg: DictConfig) -> float:
    from rlexp.cli import friendly_errors
    from rlexp.launcher import run

    with friendly_errors():
        final = run(cfg)
    return float(final.get("eval/accuracy", float("nan")))


def main(argv: list[str]) -> int:
    sys.argv = ["rlexp train", *argv]
    train()
    return 0
