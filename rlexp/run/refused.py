"""A refused `rlexp train` leaves nothing behind. Most mistakes are refused before Hydra creates the
run folder (`rlexp.run.preflight`); the few found after torch loads (a loss name, missing model
files, a layout that does not fit) are refused after Hydra wrote `RUN_DIR/.hydra/` and `train.log`
and the lock was taken. `note_created` records, before the lock is taken, the folders this
invocation is about to create; `remove_refused` removes them again after a refusal, and only when
they hold nothing but what Hydra and the lock wrote (no manifest: the run never started). A folder
that existed before is never touched. A sweep's job is refused the same way (`note_sweep`,
`note_job`), whether its own checks refuse it before torch loads or `prepare` after: its folder
goes, and the sweep's own folder with its `multirun.yaml` when this invocation created it and no
other job wrote there."""
from __future__ import annotations

import contextlib
from pathlib import Path

# What a run folder holds before the run starts: the lock, Hydra's copies of the config, Hydra's job log.
STARTUP_FILES = frozenset({".lock", ".hydra", "train.log"})
HYDRA_FILES = frozenset({"config.yaml", "hydra.yaml", "overrides.yaml"})
_CREATED: list[Path] = []  # the run folder, then each parent this invocation created, innermost first
# A sweep: its folder, the names in it before this invocation, and the folders created for it
# (the sweep's own and its parents, innermost first; empty when it existed).
_SWEEP: list[tuple[Path, frozenset[str], list[Path]]] = []
# what Hydra writes in a sweep's folder before its first job
SWEEP_FILES = frozenset({"multirun.yaml"})


def _new(path: Path) -> list[Path]:
    """`path` and its parents that do not exist yet, innermost first."""
    out = []
    for p in [path, *path.parents]:
        if p.exists() or p.is_symlink():
            break
        out.append(p)
    return out


def note_created(run_dir: Path) -> None:
    """Before the lock creates `run_dir`: remember it and its parents that do not exist yet."""
    _CREATED[:] = _new(run_dir)


def note_sweep(sweep_dir: Path) -> None:
    """Before Hydra creates a sweep's folder: what of it exists already. A job refused later is
    removed only when this invocation created its folder (`note_job`)."""
    try:
        before = frozenset(p.name for p in sweep_dir.iterdir()) if sweep_dir.is_dir() \
            else frozenset()
    except OSError:
        before = frozenset({"*"})  # unreadable: nothing in it is ours to remove
    _SWEEP[:] = [(sweep_dir, before, _new(sweep_dir))]
    _CREATED.clear()


def note_job(job_dir: Path) -> None:
    """A sweep's job starts (Hydra has created its folder and written `.hydra/`): the folders this
    invocation created for it, the job's own up to the sweep's, when its top folder in the sweep
    was not there before."""
    _CREATED.clear()
    if not _SWEEP:
        return
    sweep, before, created = _SWEEP[0]
    try:
        parts = job_dir.relative_to(sweep).parts
    except ValueError:  # a job folder outside the sweep's: not one this module knows
        return
    if not parts or parts[0] in before or "*" in before:
        return
    _CREATED[:] = [job_dir, *[p for p in job_dir.parents if sweep in p.parents], *created]


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
    sweep_created = _SWEEP[0][2] if _SWEEP else []
    for p in _CREATED:
        if p in sweep_created[:1]:  # the sweep's folder we created: its own file too, when alone
            with contextlib.suppress(OSError):
                only = {c.name for c in p.iterdir()} <= SWEEP_FILES
                if only and not (p / "multirun.yaml").is_symlink():
                    (p / "multirun.yaml").unlink(missing_ok=True)
        try:
            p.rmdir()  # only an empty folder: another process's files stay
        except OSError:
            break
    _CREATED.clear()
    return run_dir


def removed_line(gone: Path) -> str:
    """What `rlexp train` says after `remove_refused` removed `gone`."""
    if not _SWEEP:
        return f"nothing was run; the run folder {gone} this command had created is removed"
    sweep = _SWEEP[0][0]
    left = "" if sweep.exists() else f"; so is the sweep folder {sweep}, which held nothing else"
    return (f"the sweep stopped at this job, which did not run; its folder {gone}, which this "
            f"command had created, is removed{left}")
