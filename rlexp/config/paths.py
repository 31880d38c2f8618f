"""Where things live: rlexp's Hydra configs (inside the package, so a non-editable install finds them) and the
checkpoints of a run folder (the run code writes them; `rlexp eval run_dir=` reads them without importing torch)."""
from __future__ import annotations

from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CHECKPOINTS = "checkpoints"
FINAL = "final"


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def final_dir(run_dir: Path) -> Path:
    """Where a finished run's policy is exported in Hugging Face format (what `rlexp eval run_dir=` loads)."""
    return checkpoint_root(run_dir) / FINAL
