"""Where things live: rlexp's Hydra configs and the checkpoints of a run folder (the run code writes them;
`rlexp eval run_dir=` reads them without importing torch)."""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # the `rlexp` package folder


def config_root(package: Path = PACKAGE) -> Path:
    """The one config home: the repository's top-level `conf/` (groups, train.yaml, eval.yaml, sweeps/,
    launchers/). A wheel ships that folder as package data at `rlexp/conf` (setup.py maps it), so an
    installed rlexp finds it inside the package; a checkout on PYTHONPATH (or an editable install) finds it beside
    the package. Marked by `train.yaml`, so a stray empty `rlexp/conf/` folder cannot shadow the checkout's."""
    for root in (package / "conf", package.parent / "conf"):
        if (root / "train.yaml").is_file():
            return root
    raise FileNotFoundError(f"rlexp's configs are missing: neither {package / 'conf'} (an installed wheel) nor "
                            f"{package.parent / 'conf'} (a checkout) holds train.yaml; reinstall rlexp")


CONF_DIR = config_root()
CHECKPOINTS = "checkpoints"
FINAL = "final"


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def final_dir(run_dir: Path) -> Path:
    """Where a finished run's policy is exported in Hugging Face format (what `rlexp eval run_dir=` loads)."""
    return checkpoint_root(run_dir) / FINAL
