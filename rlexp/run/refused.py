"""A refused `rlexp train` leaves nothing behind. Most mistakes are refused before Hydra creates the run folder
(`rlexp.run.preflight`); the few found after torch loads (a dataset not downloaded, a character outside the
vocabulary, a layout that does not fit) are refused after Hydra wrote `RUN_DIR/.hydra/` and `train.log` and the
lock was taken. `note_created` records, before the lock is taken, the folders this invocation is about to
create; `remove_refused` removes them again after a refusal, and only when they hold nothing but what Hydra and
the lock wrote (no manifest: the run never started). A folder that existed before is never touched."""
from __future__ import annotations

import contextlib
from pathlib import Path

# What a run folder holds before the run starts: the lock, Hydra's copies of the config, Hydra's job log.
STARTUP_FILES = frozenset({".lock", ".hydra", "train.log"})
HYDRA_FILES = frozenset({"config.yaml", "hydra.yaml", "overrides.yaml"})
_CREATED: list[Path] = []  # the run folder, then each parent this invocation created, innermost first


def note_created(run_dir: Path) -> None:
    """Before the lock creates `run_dir`: remember it and its parents that do not exist yet."""
    _CREATED.clear()
    for p in [run_dir, *run_dir.parents]:
        if p.exists() or p.is_symlink():
            break
        _CREATED.append(p)


def _only_startup_files(run_dir: Path) -> bool:
    try:
        names = {p.name for p in run_dir.iterdir()}
        hydra = run_dir / ".hydra"
        hydra_ok = not hydra.exists() or (not hydra.is_symlink() and hydra.is_dir()
                                          and {p.name for p in hydra.iterdir()} <= HYDRA_FILES)
    except OSError:
        return False
    return names <= STARTUP_FILES and hydra_ok and all(
        not (run_dir / n).is_symlink() for n in names)


def remove_refused() -> Path | None:
    """After a refusal: the run folder this invocation created, removed with the parents it created (each only
    when empty then); returns the folder, or None when there was nothing of ours to remove."""
    if not _CREATED:
        return None
    run_dir = _CREATED[0]
    if not run_dir.is_dir() or not _only_startup_files(run_dir):
        return None
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / ".hydra" / name).unlink()
    with contextlib.suppress(FileNotFoundError):
        (run_dir / ".hydra").rmdir()
    for name in (".lock", "train.log"):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
    for p in _CREATED:
        try:
            p.rmdir()  # only an empty folder: another process's files stay
        except OSError:
            break
    _CREATED.clear()
    return run_dir
