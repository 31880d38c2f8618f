"""Where rlexp's Hydra configs live: inside the package, so a non-editable install finds them."""
from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
