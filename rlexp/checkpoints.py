"""Run checkpoints and resume: the folder layout, atomic writes, safe reads, and the resume checks.

A run folder holds `checkpoints/step_NNNNNN/` (trainer.pt, controller.pt, meta.json, COMPLETE) and
`checkpoints/final/` (the policy in Hugging Face format). A checkpoint is written to a hidden temporary
folder, marked COMPLETE and then renamed, so a crash never leaves a half checkpoint that resume would
pick. Everything is read with `torch.load(weights_only=True)`: a checkpoint holds tensors and plain
values only, so `resume=PATH` on a file from elsewhere cannot run code.
"""
from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rlexp.tracking.base import METRICS_FILE
from rlexp.tracking.manifest import atomic_write_text, config_hash

CHECKPOINTS = "checkpoints"
FINAL = "final"
COMPLETE = "COMPLETE"
# Keys that may change across a resume without changing what the run computes.
RESUMABLE_KEYS = ("resume", "force_resume", "steps")


class ResumeError(ValueError):
    """A checkpoint that cannot (or must not) be resumed; the message says what to do instead."""


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def final_dir(run_dir: Path) -> Path:
    """Where a finished run's policy is exported in Hugging Face format (what `rlexp eval run_dir=` loads)."""
    return checkpoint_root(run_dir) / FINAL


def check_safe(path: Path) -> None:
    """Refuse a file that is not a `torch.save` archive of tensors and plain values, without loading its
    tensors (cheap even for a large trainer state, so resume checks it before spawning anything)."""
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except (ValueError, RuntimeError, OSError) as e:
        raise ResumeError(f"refusing to load {path}: it is not a checkpoint written by torch.save ({e}); "
                          f"resume from a folder rlexp wrote, or start again with resume=never") from None
    if unsafe:
        shown = ", ".join(unsafe[:5]) + (", ..." if len(unsafe) > 5 else "")
        raise ResumeError(
            f"refusing to load {path}: it references Python objects ({shown}), not only tensors and plain values, "
            f"and loading it could run code. rlexp's checkpoints hold tensors and plain values only; if an older "
            f"rlexp wrote this one (its controller.pt held dataclasses), resume it with that version (its git "
            f"commit is in the run's manifest.json), or start again with resume=never")


def safe_load(path: Path) -> Any:
    """`torch.load` of tensors and plain values only: nothing in the file can run code."""
    check_safe(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # check_safe passed, so this is a damaged file
        raise ResumeError(f"refusing to load {path}: {str(e).splitlines()[0]}") from None


def check_resumable(ckpt: Path) -> None:
    """Everything resume will read, checked before any process is spawned."""
    for name in ("meta.json", "controller.pt", "trainer.pt"):
        if not (ckpt / name).is_file():
            raise ResumeError(f"{ckpt} is not a complete checkpoint: {name} is missing")
    check_safe(ckpt / "controller.pt")
    check_safe(ckpt / "trainer.pt")


def resume_hash(cfg: DictConfig) -> str:
    """Hash of the config minus the keys that may legitimately change across a resume."""
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    for k in RESUMABLE_KEYS:
        c.pop(k, None)
    return config_hash(c)


def find_resume(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint `resume` (never | auto | PATH) points at: the newest COMPLETE one."""
    if resume == "never":
        return None
    root = Path(run_dir) if resume == "auto" else Path(resume)
    if (root / "controller.pt").exists():
        return root
    ckpts = sorted(checkpoint_root(root).glob("step_*")) if checkpoint_root(root).exists() else []
    ckpts = [d for d in ckpts if (d / COMPLETE).exists()]
    if ckpts:
        return ckpts[-1]
    if resume == "auto":
        return None
    raise ResumeError(f"resume={resume}: no complete checkpoint there "
                      f"(expected {root}/{CHECKPOINTS}/step_*/{COMPLETE}); "
                      f"use resume=auto in the run's folder (hydra.run.dir=RUN_DIR) or resume=never")


def read_meta(ckpt: Path) -> dict[str, Any]:
    """`meta.json` checked for shape (JSON only, never code): a damaged or hand-edited file is a ResumeError."""
    path = ckpt / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResumeError(f"{path}: unreadable ({e}); resume from another checkpoint or with resume=never") from None
    if not (isinstance(meta, dict) and all(isinstance(meta.get(k), int) and not isinstance(meta.get(k), bool)
                                           and meta[k] >= 0 for k in ("step", "version"))
            and isinstance(meta.get("resume_hash"), str)):
        raise ResumeError(f"{path}: expected {{\"step\": int >= 0, \"version\": int >= 0, \"resume_hash\": str}}, "
                          f"got {str(meta)[:200]}; resume from another checkpoint or with resume=never")
    return meta


def check_resume_config(ckpt: Path, cfg_hash: str, force: bool) -> None:
    """Refuse to continue a run under a config other than the one that wrote the checkpoint."""
    meta = read_meta(ckpt)
    if meta["resume_hash"] != cfg_hash and not force:
        raise ResumeError(f"refusing to resume from {ckpt}: the config differs from the one that wrote it "
                          f"(hash {meta['resume_hash'][:12]} vs {cfg_hash[:12]}); rerun with the original overrides, "
                          f"or add force_resume=true to continue under the new config")


def save(run_dir: Path, step: int, version: int, cfg_hash: str, keep: int,
         write_trainer: Callable[[Path], None], controller_state: dict[str, Any]) -> Path:
    """Write checkpoint `step` atomically and keep the newest `keep`. `write_trainer(path)` writes the
    trainer's file (it lives in another process); `controller_state` must hold plain values only."""
    root = checkpoint_root(run_dir)
    out, tmp = root / f"step_{step:06d}", root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_trainer(tmp / "trainer.pt")
    torch.save(controller_state, tmp / "controller.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, "version": version, "resume_hash": cfg_hash}))
    (tmp / COMPLETE).write_text("")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    kept = sorted(root.glob("step_*"))
    for old in kept[: max(0, len(kept) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def load_controller_state(ckpt: Path) -> dict[str, Any]:
    return safe_load(ckpt / "controller.pt")


def truncate_metrics(run_dir: Path, last_step: int) -> int:
    """Drop rows with step > last_step (atomically) and return how many were dropped: steps logged after
    the checkpoint being resumed are logged again, and duplicates would break `rlexp compare`."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return 0
    keep, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut by the crash
            dropped += 1
            continue
        if int(row.get("step", 0)) > last_step:
            dropped += 1
        else:
            keep.append(line)
    atomic_write_text(path, "".join(f"{x}\n" for x in keep))
    return dropped
