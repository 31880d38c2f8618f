"""Run checkpoints and resume: the folder layout, atomic writes, safe reads, and the resume checks.

A run folder holds `checkpoints/step_NNNNNN/` (trainer.pt, controller.pt, meta.json, COMPLETE) and
`checkpoints/final/` (the policy in Hugging Face format). A checkpoint is written to a hidden temporary
folder, marked COMPLETE and then renamed, so a crash never leaves a half checkpoint that resume would
pick. Everything is read with `torch.load(weights_only=True)`: a checkpoint holds tensors and plain
values only, so `resume=PATH` on a file from elsewhere cannot run code.

`meta.json` records each file's sha256, so a checkpoint damaged after it was written (a bad disk, a copy cut
short, a stray write) is caught before anything is spawned, and resume falls back to the newest intact one,
saying which and why. The digests are computed by streaming the files (a model's trainer state does not fit
twice in memory): on the tiny model's 4 MB trainer.pt, 12-25 ms per save and per resume check (about 300 MB/s
on a loaded 2-core machine, so some 3 s per GB of trainer state).
"""
from __future__ import annotations

import errno
import json
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.config.paths import CHECKPOINTS, checkpoint_root
from rlexp.core.weight_files import CheckpointError  # torch-free: no torch before the run lock
from rlexp.errors import disk_full
from rlexp.tracking.base import METRICS_FILE, TABLES_DIR
from rlexp.tracking.files import atomic_write_text, sha256_file
from rlexp.tracking.manifest import MANIFEST_NAME, read_manifest
from rlexp.tracking.metrics_file import read_metrics
from rlexp.tracking.runconfig import config_hash

COMPLETE = "COMPLETE"
# Keys that may change across a resume without changing what the run computes.
RESUMABLE_KEYS = ("resume", "force_resume", "steps")
HASHED = ("trainer.pt", "controller.pt")  # their sha256 is in meta.json
LOW_SPACE = 1 << 20  # bytes free after a failed write below which the disk is taken to be full


class ResumeError(ValueError):
    """A checkpoint that cannot (or must not) be resumed; the message says what to do instead."""


def check_safe(path: Path) -> None:
    """`rlexp.core.weights.check_safe`, refused as a `ResumeError` (resume's own error, with what to do instead)."""
    from rlexp.core import weights

    try:
        weights.check_safe(path)
    except CheckpointError as e:
        raise ResumeError(str(e)) from None


def safe_load(path: Path) -> Any:
    from rlexp.core import weights

    try:
        return weights.safe_load(path)
    except CheckpointError as e:
        raise ResumeError(str(e)) from None


def check_resumable(ckpt: Path) -> None:
    """Everything resume will read, checked before any process is spawned: the files are there, unchanged
    since they were written (sha256 in meta.json), and hold tensors and plain values only."""
    for name in ("meta.json", "controller.pt", "trainer.pt"):
        if not (ckpt / name).is_file():
            raise ResumeError(f"{ckpt} is not a complete checkpoint: {name} is missing")
    digests = read_meta(ckpt).get("sha256")
    if digests is not None:  # checkpoints written before digests were recorded are checked as before
        for name in HASHED:
            if digests.get(name) != sha256_file(ckpt / name):
                raise ResumeError(f"{ckpt / name} is corrupt: its sha256 differs from the one recorded in "
                                  f"{ckpt / 'meta.json'} when it was written")
    check_safe(ckpt / "controller.pt")
    check_safe(ckpt / "trainer.pt")


def resume_hash(cfg: DictConfig | Mapping[str, Any]) -> str:
    """Hash of the config minus the keys that may legitimately change across a resume. Taken from the config
    as composed, before `prepare` derives unset values from the machine (`cluster.threads_per_proc`, a
    `trainer.micro_batch_size` of 0): the same command must hash the same, also on a finished run. A
    plain mapping (the run's record, `rlexp.run.prepare.recorded`) is already resolved."""
    # `hydra` is there only in Hydra's callbacks (never in the task's cfg), and does not resolve there yet.
    keys = [k for k in cfg if k not in (*RESUMABLE_KEYS, "hydra")]
    if not isinstance(cfg, DictConfig):
        return config_hash({k: cfg[k] for k in keys})
    c = OmegaConf.to_container(OmegaConf.masked_copy(cfg, keys), resolve=True)
    assert isinstance(c, dict)
    return config_hash(c)


def check_finished_config(run_dir: Path, cfg: DictConfig) -> None:
    """A finished run relaunched under another config is the mistake `check_resume_config` refuses on a
    resume: refuse it the same way instead of answering "nothing to do" for a config that never ran."""
    if (newest := find_resume("auto", run_dir, say=lambda _: None)) is not None:
        check_resume_config(newest, resume_hash(cfg), bool(cfg.get("force_resume", False)),
                            _recorded_hash(run_dir, cfg))


# Values `prepare` derives when unset (None, or 0 for the micro-batch), as the run's manifest recorded them.
DERIVED = {"cluster.threads_per_proc": None, "trainer.micro_batch_size": 0}


def _recorded_hash(run_dir: Path, cfg: DictConfig) -> str | None:
    """The hash a checkpoint written before derived values were left out of it recorded: `cfg` with the
    values the run derived, from its manifest (plain numbers only; anything else gives no hash)."""
    try:
        recorded = read_manifest(run_dir).config
    except (OSError, ValueError):
        return None
    filled = cfg.copy()
    for key, unset in DERIVED.items():
        section, name = key.split(".")
        value = (recorded.get(section) or {}).get(name) if isinstance(recorded.get(section), dict) else None
        if filled.get(section) is None or filled[section].get(name) != unset:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        filled[section][name] = value
    return resume_hash(filled)


def find_resume(resume: str, run_dir: Path, say: Callable[[str], None] | None = None) -> Path | None:
    """The checkpoint `resume` (never | auto | PATH) points at: the newest COMPLETE one that passes
    `check_resumable`. A damaged newer one is skipped, and `say` (default: stderr) is told which and why; a
    PATH that is itself a checkpoint must be intact, since the user chose it."""
    if resume == "never":
        return None
    root = Path(resume) if resume != "auto" else Path(run_dir)
    if (root / "controller.pt").exists():
        check_resumable(root)
        return root
    ckpts = sorted(checkpoint_root(root).glob("step_*")) if checkpoint_root(root).exists() else []
    ckpts = [d for d in ckpts if (d / COMPLETE).exists()]
    skipped: list[str] = []
    for ckpt in reversed(ckpts):
        try:
            check_resumable(ckpt)
        except ResumeError as e:
            skipped.append(str(e))
            continue
        for why in skipped:
            (say or _stderr)(f"[rlexp] skipping a damaged checkpoint: {why}; resuming from {ckpt.name}, the newest "
                             f"intact one")
        return ckpt
    if skipped:
        raise ResumeError(f"resume={resume}: no intact checkpoint under {checkpoint_root(root)} ("
                          + "; ".join(skipped) + "); start again with resume=restart")
    if resume == "auto":
        return None
    raise ResumeError(f"resume={resume}: no complete checkpoint there "
                      f"(expected {root}/{CHECKPOINTS}/step_*/{COMPLETE}); "
                      f"use resume=auto in the run's folder (hydra.run.dir=RUN_DIR) or resume=never")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def read_meta(ckpt: Path) -> dict[str, Any]:
    """A checkpoint's meta.json, checked for shape (JSON only, never code); a damaged or hand-edited one is a
    `ResumeError` naming it (so resume skips that checkpoint)."""
    path = ckpt / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        counts = isinstance(meta, dict) and all(
            isinstance(meta.get(k), int) and not isinstance(meta.get(k), bool) and meta[k] >= 0
            for k in ("step", "version"))
        if not (counts and isinstance(meta.get("resume_hash"), str) and isinstance(meta.get("sha256", {}), dict)):
            raise ValueError("not the object rlexp writes: {\"step\": int >= 0, \"version\": int >= 0, "
                             "\"resume_hash\": str, \"sha256\": {file: hex}}")
    except (ValueError, OSError) as e:
        raise ResumeError(f"{path} is corrupt: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return meta


def finished(run_dir: Path, steps: int) -> str | None:
    """What to tell the user when `resume=auto` finds a run that already completed `steps` steps (manifest
    status completed, its last metrics row at that step), else None: resuming would train its last steps
    again from the newest checkpoint, which is always older than the end."""
    try:
        status = read_manifest(run_dir).status
        rows = read_metrics(Path(run_dir) / METRICS_FILE, warn=lambda _: None)
    except (OSError, ValueError):
        return None
    last = max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=None)
    if status != "completed" or last != steps:
        return None
    return (f"run {run_dir} is already complete ({steps} steps, status completed in {MANIFEST_NAME}); nothing "
            f"to do. To train further, resume=auto with more steps; to start over, use another hydra.run.dir")


def check_resume_config(ckpt: Path, cfg_hash: str, force: bool, legacy_hash: str | None = None) -> None:
    """Refuse to continue a run under a config other than the one that wrote the checkpoint. `legacy_hash`:
    the hash with derived values filled in, as checkpoints written before they were left out recorded it."""
    meta = read_meta(ckpt)
    if meta["resume_hash"] not in (cfg_hash, legacy_hash) and not force:
        raise ResumeError(f"refusing to resume from {ckpt}: the config differs from the one that wrote it "
                          f"(hash {meta['resume_hash'][:12]} vs {cfg_hash[:12]}); rerun with the original overrides, "
                          f"or add force_resume=true to continue under the new config")


def check_average(ckpt: Path, controller: Mapping[str, Any], ema_decay: float) -> None:
    """A run with `trainer.ema_decay` > 0 resumed from a checkpoint that holds no weight average
    (forced past the config check) is refused before anything spawns: the average must not
    silently start again from the live weights. `controller`: the checkpoint's controller record
    (`load_controller_state(ckpt)["controller"]`); one from before it recorded the average is
    left to the trainer's own check when it loads."""
    if ema_decay > 0 and controller.get("ema") is False:
        raise ResumeError(f"{ckpt} holds no weight average, but trainer.ema_decay={ema_decay}: "
                          f"resume with the setting the run was started with (trainer.ema_decay=0)")


def _earlier_rows(run_dir: Path) -> list[int]:
    """The steps `metrics.jsonl` already holds (a crash-cut last line is skipped, silently)."""
    try:
        rows = read_metrics(Path(run_dir) / METRICS_FILE, warn=lambda _: None)
    except ValueError:  # damaged in the middle: it holds something all the same
        return [-1]
    return [r["step"] for r in rows if isinstance(r.get("step"), int)]


def check_start(run_dir: Path, resume: str, resume_from: Path | None, steps: int, evaluated: bool) -> None:
    """Refuse a start that would log a step twice, before anything is spawned: a run folder that already holds
    steps, with no checkpoint to continue from (starting at step 0 would append a second history to its
    metrics.jsonl), or `steps` below the checkpoint's own step. `evaluated`: the checkpoint's step was evaluated
    (its last row is complete), so `steps` equal to it only finishes the run."""
    if resume_from is None:
        done = _earlier_rows(run_dir) if resume in ("auto", "never") else []
        if done:
            how = ("no checkpoint to continue from (checkpoint.every_n_steps=0 writes none before the end; a "
                   "SIGTERM or SIGUSR1 writes one)" if resume == "auto" else
                   "continue it with resume=auto" if find_resume("auto", run_dir, say=lambda _: None)
                   else "it has no checkpoint")
            raise ResumeError(f"resume={resume}: {run_dir} already holds a run ({_status(run_dir)}steps "
                              f"{min(done)}-{max(done)} in {METRICS_FILE}) and {how}; starting at step 0 "
                              f"would log those steps twice. To start over in this folder, discarding its "
                              f"metrics and checkpoints, add resume=restart; or use another hydra.run.dir")
        return
    at = read_meta(resume_from)["step"]
    if steps < at or (steps == at and not evaluated):
        raise ResumeError(f"steps={steps} is {'below' if steps < at else 'not above'} the step of the checkpoint "
                          f"being resumed, {at} ({resume_from}): a resume cannot go back. Use steps={at + 1} or "
                          f"more, resume=PATH with an older checkpoint, or resume=restart to start over")


def resume_point(run_dir: Path, resume: str, steps: int, force: bool, cfg_hash: str, legacy_hash: str,
                 say: Callable[[str], None], ema_decay: float = 0.0) -> Path | None:
    """Where the run starts, every check done and the folder made ready, before anything is spawned: the
    checkpoint to continue from (None: step 0), refused when it would log a step twice (`check_start`) or
    was written under another config or holds no weight average that `ema_decay` needs
    (`check_average`); the folder's rows after it dropped (`truncate_metrics`); with
    `resume=restart`, its old history removed first (`restart`)."""
    if resume == "restart":
        if removed := restart(run_dir):
            say(f"[rlexp] resume=restart: removed {', '.join(removed)} from {run_dir}; starting at step 0")
        resume = "never"
    ckpt = find_resume(resume, run_dir, say=say)  # checked, intact
    if ckpt is not None:
        check_resume_config(ckpt, cfg_hash, force, legacy_hash)
        controller = load_controller_state(ckpt).get("controller", {})
        check_average(ckpt, controller, ema_decay)
        evaluated = controller.get("evaluated_at") == read_meta(ckpt)["step"]
        check_start(run_dir, resume, ckpt, steps, evaluated)
        truncate_metrics(run_dir, read_meta(ckpt)["step"])
    else:
        check_start(run_dir, resume, None, steps, False)
    return ckpt


def _status(run_dir: Path) -> str:
    try:
        return f"status {read_manifest(run_dir).status}, "
    except (OSError, ValueError):
        return ""


def restart(run_dir: Path) -> list[str]:
    """`resume=restart`: the run folder's history is discarded (metrics, tables, evaluation samples,
    checkpoints) so the new run starts at step 0 alone in it. Returns what was removed, to say so."""
    removed = []
    for name in (METRICS_FILE, TABLES_DIR, "eval_samples", "eval_results.json", CHECKPOINTS):
        path = Path(run_dir) / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
        else:
            continue
        removed.append(name)
    return removed


def resume_command(command: str | None, run_dir: Path) -> str:
    """The command that continues this run: the recorded one (`manifest.command`) with `resume=auto` in place
    of any `resume=...`, and the run folder named, so a timestamped default folder is found again."""
    args = [a for a in shlex.split(command or "rlexp train") if not a.startswith(("resume=", "+resume="))]
    if not any(a.startswith("hydra.run.dir=") for a in args):
        args.append(f"hydra.run.dir={run_dir}")
    return shlex.join([*args, "resume=auto"])


def save(run_dir: Path, step: int, version: int, cfg_hash: str, keep: int,
         write_trainer: Callable[[Path], None], controller_state: dict[str, Any]) -> Path:
    """Write checkpoint `step` atomically and keep the newest `keep`. `write_trainer(path)` writes the
    trainer's file (it lives in another process); `controller_state` must hold plain values only. A failed
    write (a full disk) removes the temporary folder before the error goes on."""
    import torch

    root = checkpoint_root(run_dir)
    out, tmp = root / f"step_{step:06d}", root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write_trainer(tmp / "trainer.pt")
        torch.save(controller_state, tmp / "controller.pt")
        meta = {"step": step, "version": version, "resume_hash": cfg_hash,
                "sha256": {name: sha256_file(tmp / name) for name in HASHED}}
        (tmp / "meta.json").write_text(json.dumps(meta))
        (tmp / COMPLETE).write_text("")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    except Exception as e:
        free = shutil.disk_usage(root).free  # before the cleanup frees space again
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(e) is None and free < LOW_SPACE:  # torch.save reports a full disk as an iostream error
            raise OSError(errno.ENOSPC, f"No space left on device ({free} bytes free) while writing checkpoint "
                                        f"step {step}", str(out)) from e
        raise
    except BaseException:  # Ctrl-C half-way
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    kept = sorted(root.glob("step_*"))
    for old in kept[: max(0, len(kept) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return out


def load_controller_state(ckpt: Path) -> dict[str, Any]:
    return safe_load(ckpt / "controller.pt")


def truncate_metrics(run_dir: Path, last_step: int) -> int:
    """Drop rows with step > last_step from `metrics.jsonl` and every table (`tables/*.jsonl`), each file
    atomically (the truncated copy is written, then replaces it, so a crash during resume loses nothing), and
    return how many metrics rows were dropped: steps logged after the checkpoint being resumed are logged again
    identically, and duplicates would break `rlexp compare`. A line cut by a crash is dropped with a warning;
    damage elsewhere stops the resume (`read_metrics`)."""
    tables = Path(run_dir) / TABLES_DIR
    for table in sorted(tables.glob("*.jsonl")) if tables.is_dir() else []:
        _truncate(table, last_step, default=str)
    return _truncate(Path(run_dir) / METRICS_FILE, last_step)


def _truncate(path: Path, last_step: int, default: Callable[[Any], Any] | None = None) -> int:
    if not path.exists():
        return 0
    rows = read_metrics(path)
    keep = [r for r in rows if not (isinstance(r.get("step"), int) and r["step"] > last_step)]
    n_lines = sum(1 for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip())
    if len(keep) < n_lines:
        atomic_write_text(path, "".join(json.dumps(r, allow_nan=True, default=default) + "\n" for r in keep))
    return n_lines - len(keep)
