"""Writing in a run folder without following links: a run folder someone mailed you, or one that was tampered
with, must not choose where rlexp's bytes go, nor which files a tracker uploads.

The rule, one for every writer: the run folder itself, and any folder above it, may be a link (to scratch, to
another disk): that is the user's own choice. Inside it, nothing is a link, a fifo, a socket or a device. The
only exception is inside a `wandb/` folder (itself a real folder), W&B's own area: W&B makes links there
(`latest-run`, `debug.log`, `logs/debug-core.log` into its cache), replaces rather than writes through the
ones it keeps, writes each run into a new folder of its own, and rlexp neither writes nor uploads there.

`check_run_folder` enforces it before anything is written (the run-folder lock, `rlexp.run.runlock.hold`, calls
it, and `rlexp train` does so before Hydra writes `.hydra/` and opens `train.log`); it also refuses a folder that
cannot be written, which would otherwise fail halfway through start-up. The files rlexp opens in place
(`metrics.jsonl`, `tables/*.jsonl`, eval samples, the lock, temporary files) also go through `nofollow_opener`,
so a link planted in place of one of them after the check is refused at open time instead of written
through (a folder replaced by a link meanwhile is only caught by the next check). `artifact_files` is what a
tracker uploads: only regular files whose real location is inside the run folder.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

WANDB_DIR = "wandb"
_SHOWN = 5  # problems named in one message; the rest are counted
_ELSEWHERE = "hydra.run.dir=..., or hydra.sweep.dir=... for a sweep"


class RunFolderUnsafe(RuntimeError):
    """The run folder holds a link or special file, or cannot be written; the message names them and the fix."""


def nofollow_opener(path: str | os.PathLike[str], flags: int) -> int:
    """An `opener=` for `open()`: the last path component is never followed when it is a link (`O_NOFOLLOW`)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunFolderUnsafe(
                f"{path} is a symbolic link; rlexp never writes through a link in a run folder. Remove the link "
                f"(rm {path}) or write to another folder (hydra.run.dir=...)") from None
        raise


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under `root` (not `root` itself) with its own `lstat`; never descends through a link."""
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:  # unreadable: reported as not writable by the caller's own check of `folder`
            continue
        for entry in entries:
            p = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:  # gone meanwhile
                continue
            yield p, st
            if stat.S_ISDIR(st.st_mode):
                stack.append(p)


def _in_wandb(link: Path, root: Path) -> bool:
    """Inside a `wandb/` folder of the tree: W&B's own area, where rlexp neither writes nor uploads."""
    return WANDB_DIR in link.relative_to(root).parts[:-1]


def problems(run_dir: Path) -> tuple[list[str], list[str]]:
    """(links and special files, what cannot be written) inside `run_dir`, one phrase each; empty when the
    folder is fine or does not exist yet."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():  # absent, or not a folder (`check_run_folder` says so); it may be a link
        return [], []
    unsafe: list[str] = []
    read_only: list[str] = [] if os.access(run_dir, os.W_OK) else [str(run_dir)]
    for p, st in sorted(_walk(run_dir)):
        if stat.S_ISLNK(st.st_mode):
            if not _in_wandb(p, run_dir):
                unsafe.append(f"{p} is a link to {os.readlink(p)}")
        elif not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            unsafe.append(f"{p} is {_kind(st.st_mode)}, not a regular file or folder")
        elif not os.access(p, os.W_OK, follow_symlinks=False):
            read_only.append(str(p))
    return unsafe, read_only


def _kind(mode: int) -> str:
    return ("a fifo" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file")


def _listed(items: list[str]) -> str:
    more = len(items) - _SHOWN
    return ", ".join(items[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


def check_run_folder(run_dir: Path) -> None:
    """Raise `RunFolderUnsafe` naming what `problems` finds, and what to do about it."""
    if os.path.lexists(run_dir) and not Path(run_dir).is_dir():
        raise RunFolderUnsafe(f"run folder {run_dir} exists and is not a folder; move it away or write to "
                              f"another folder ({_ELSEWHERE})")
    unsafe, read_only = problems(run_dir)
    if unsafe:
        raise RunFolderUnsafe(
            f"run folder {run_dir} holds what rlexp will not write through: {_listed(unsafe)}. rlexp never writes "
            f"through a link inside a run folder, nor uploads what one points to (the run folder itself may be a "
            f"link). Remove them, or copy the folder without them, or write to another folder ({_ELSEWHERE})")
    if read_only:
        raise RunFolderUnsafe(
            f"run folder {run_dir} cannot be written: {_listed(read_only)} (read-only). Make it writable "
            f"(chmod -R u+w {run_dir}), or copy it somewhere writable, or write to another folder "
            f"({_ELSEWHERE})")


def artifact_files(path: str | os.PathLike[str], run_dir: Path) -> list[tuple[Path, Path]]:
    """(file, its path relative to `path`) for every regular file at or under `path` whose real location is
    inside `run_dir`: a link (to a file or a folder) is skipped, never followed, and said so on stderr. A single
    file is returned as (file, its name)."""
    p, root = Path(path), os.path.realpath(run_dir)
    skipped: list[str] = []
    out: list[tuple[Path, Path]] = []
    try:
        st = os.lstat(p)
    except OSError:
        return []
    if not _inside(os.path.realpath(p), root):
        skipped.append(f"{p} (outside the run folder {run_dir})")
    elif stat.S_ISREG(st.st_mode):
        out.append((p, Path(p.name)))
    elif stat.S_ISDIR(st.st_mode):
        for f, fst in sorted(_walk(p)):
            if stat.S_ISREG(fst.st_mode):
                out.append((f, f.relative_to(p)))
            elif not stat.S_ISDIR(fst.st_mode):
                skipped.append(f"{f} ({'a link' if stat.S_ISLNK(fst.st_mode) else _kind(fst.st_mode)})")
    else:
        skipped.append(f"{p} ({'a link' if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)})")
    if skipped:
        print(f"[rlexp] warning: not uploading {_listed(skipped)}: only regular files inside the run folder are "
              f"uploaded", file=sys.stderr, flush=True)
    return out
