"""This machine's CUDA stack, and whether rlexp's wheels can run on it: the preflight of `rlexp doctor` and of
`rlexp train` on CUDA.

Why: the `gpu` extra installs torch 2.14.0 built for CUDA 13.0 (the build vllm 0.33 pins). CUDA 13.x runs only on
an NVIDIA driver >= 580.65.06 on Linux (NVIDIA's CUDA 13.0 release notes, driver table; 13.x minor versions need
the same 580 branch). On an older driver torch says `torch.cuda.is_available() == False` behind a warning easy to
miss, or the first kernel fails inside an actor minutes into start-up; here the driver is compared before
anything spawns, and the message says which driver to install.

The queries (torch, NVML through `pynvml`, `nvidia-smi`) each may be absent; what is missing is reported as
unknown, never raised. `CudaFacts` is a plain value, so the refusal logic is tested with facts made up by hand
(tests/test_doctor.py), the CUDA queries being what a CPU machine cannot run.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from rlexp.config.validate import ConfigError

# The oldest Linux driver each CUDA major runs on (NVIDIA's CUDA toolkit release notes: the driver of the major's
# first release; later minor versions run on it through minor-version compatibility).
MIN_DRIVER: dict[int, str] = {13: "580.65.06", 12: "525.60.13"}


@dataclass(frozen=True)
class CudaFacts:
    """What torch and the driver say about this machine."""

    torch: str                       # torch.__version__
    cuda: str | None                 # torch.version.cuda: the CUDA the wheel was built for (None: a CPU build)
    available: bool                  # torch.cuda.is_available()
    driver: str | None = None        # the NVIDIA driver, e.g. "580.65.06" (None: not found)
    driver_from: str = "not found"   # which query found it: NVML, nvidia-smi
    gpus: tuple[str, ...] = ()       # the devices torch sees, in its order (after CUDA_VISIBLE_DEVICES)
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES as this process got it (a scheduler's mask)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def _nvml_driver() -> str | None:
    import pynvml  # nvidia-ml-py, which the `gpu` extra brings in through vllm

    pynvml.nvmlInit()
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    finally:
        pynvml.nvmlShutdown()


def _smi_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=30, check=True).stdout.split()
    return out[0] if out else None


DRIVER_QUERIES: tuple[tuple[str, Callable[[], str | None]], ...] = (("NVML", _nvml_driver),
                                                                     ("nvidia-smi", _smi_driver))


def find_driver(queries: tuple[tuple[str, Callable[[], str | None]], ...] = DRIVER_QUERIES
                ) -> tuple[str | None, str]:
    """(driver version, which query answered); (None, "not found") when none does (absent, or failing)."""
    for name, query in queries:
        try:
            v = query()
        except Exception:  # not installed, no driver loaded, no permission: try the next one
            continue
        if v:
            return v.strip(), name
    return None, "not found"


def query_cuda() -> CudaFacts:
    """The real queries. Imports torch (not at module import: `rlexp doctor --help` stays light)."""
    import torch

    available = torch.cuda.is_available()
    driver, source = find_driver() if torch.version.cuda else (None, "not found")
    gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) if available else ()
    return CudaFacts(torch=torch.__version__, cuda=torch.version.cuda, available=available, driver=driver,
                     driver_from=source, gpus=gpus, visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def driver_problem(f: CudaFacts) -> str | None:
    """Why this driver cannot run this torch build, with the fix; None when it can (or nothing says otherwise)."""
    if f.cuda is None or f.driver is None:
        return None
    need = MIN_DRIVER.get(_numbers(f.cuda)[0])
    if need is None or _numbers(f.driver) >= _numbers(need):
        return None
    return (f"NVIDIA driver {f.driver} ({f.driver_from}) is older than {need}, the oldest that runs CUDA {f.cuda}, "
            f"which torch {f.torch} is built for. Fix: install NVIDIA driver >= {need} (the 580 branch or newer) "
            f"and reboot or reload the kernel module; where you cannot change the driver, install a torch and vllm "
            f"built for the CUDA that `nvidia-smi` reports instead of `bash scripts/setup.sh --gpu`'s pins")


def describe(f: CudaFacts) -> list[str]:
    """The lines `rlexp doctor` prints about the machine."""
    lines = [f"torch {f.torch}, " + (f"built for CUDA {f.cuda}" if f.cuda else "CPU build (no CUDA)")]
    if f.cuda:
        need = MIN_DRIVER.get(_numbers(f.cuda)[0])
        lines.append(f"NVIDIA driver: {f.driver or 'unknown'} ({f.driver_from})"
                     + (f"; CUDA {f.cuda} needs >= {need}" if need else ""))
    mask = f"CUDA_VISIBLE_DEVICES={f.visible_devices}" if f.visible_devices is not None \
        else "CUDA_VISIBLE_DEVICES unset"
    if f.available:
        lines.append(f"GPUs visible ({mask}): {len(f.gpus)}")
        lines += [f"  cuda:{i} {name}" for i, name in enumerate(f.gpus)]
    else:
        lines.append(f"no CUDA device visible to torch ({mask})")
    return lines


def check_cuda(f: CudaFacts, gpus_needed: int = 0) -> None:
    """Refuse a CUDA run this machine cannot start, before anything spawns: a driver too old for the torch
    build, torch without CUDA, or fewer GPUs visible than the run places roles on."""
    if problem := driver_problem(f):
        raise ConfigError(problem)
    if not f.available:
        why = "torch is a CPU build" if f.cuda is None else "torch sees no GPU (driver not loaded, or a mask hides all)"
        raise ConfigError(f"cluster.device=cuda, but {why}: torch {f.torch}. Fix: `bash scripts/setup.sh --gpu` on a "
                          f"machine with NVIDIA GPUs, then `rlexp doctor`; or run on CPU (cluster=local)")
    if gpus_needed > len(f.gpus):
        raise ConfigError(f"the run places its roles on {gpus_needed} GPUs, but torch sees {len(f.gpus)} "
                          f"(CUDA_VISIBLE_DEVICES={f.visible_devices}). Fix: `rlexp plan` with the same overrides "
                          f"shows each role's GPUs; lower model.parallelism.* / generator.replicas to fit")


def check_driver(facts: CudaFacts | None = None) -> None:
    """`rlexp train`'s part of the preflight on CUDA: one stderr line with torch's CUDA build and the driver, and
    the refusal of a driver too old for it (the GPU count is `rlexp.cluster.planner.check_devices`' to check)."""
    f = facts if facts is not None else query_cuda()
    print("[rlexp] " + "; ".join(describe(f)[:2]), file=sys.stderr)
    if problem := driver_problem(f):
        raise ConfigError(problem)


# What torch will see, decided before it loads (`rlexp.run.preflight`): its build read from its
# version file, the GPUs and the driver from `nvidia-smi`, the mask from the environment. Wherever
# that cannot be told for sure (ROCm, MIG, a mask of UUIDs, GPUs of different sizes behind a mask,
# no query that answers while the driver's device node exists), the answer is None and torch
# decides after it loads (`rlexp.run.prepare.check_config`): never a refusal torch would not make.

@dataclass(frozen=True)
class SmiGpu:
    """One GPU as `nvidia-smi --query-gpu` lists it."""

    memory_mib: float
    mig: str  # mig.mode.current: "Enabled", "Disabled" or "[N/A]" (no MIG on this GPU)
    driver: str


def torch_build() -> tuple[str, str | None, str | None] | None:
    """(torch's version, the CUDA its build targets, ROCm's HIP version), read from torch's
    version.py without importing torch (seconds); None when torch or the file is not found."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    try:
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    values: dict[str, str | None] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) \
                and (value.value is None or isinstance(value.value, str)):
            values[target.id] = value.value
    version = values.get("__version__")
    if version is None or "cuda" not in values:
        return None
    return version, values["cuda"], values.get("hip")


def smi_gpus() -> list[SmiGpu] | None:
    """Every GPU `nvidia-smi` lists, in its order; [] when this machine has no NVIDIA driver (no
    `/dev/nvidiactl`: CUDA cannot run); None when the driver is there but cannot be asked."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None if os.path.exists("/dev/nvidiactl") else []
    try:
        out = subprocess.run([exe, "--query-gpu=memory.total,mig.mode.current,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
        rows = [[p.strip() for p in line.split(",")] for line in out.splitlines() if line.strip()]
        return [SmiGpu(float(mib), mig, driver) for mib, mig, driver in rows]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def visible_count(mask: str | None, gpus: int) -> int | None:
    """How many GPUs CUDA shows under `CUDA_VISIBLE_DEVICES=mask` on a machine of `gpus`: the
    indices up to the first that is not one of this machine's (CUDA ignores the rest); None for
    a mask CUDA reads another way (UUIDs, MIG names)."""
    if mask is None:
        return gpus
    seen: list[int] = []
    for part in (p.strip() for p in mask.split(",")):
        if not part.lstrip("-").isdigit():
            return None if part else len(seen)
        if not 0 <= int(part) < gpus or int(part) in seen:
            break
        seen.append(int(part))
    return len(seen)


def host_cuda(build: tuple[str, str | None, str | None] | None, smi: list[SmiGpu] | None,
              mask: str | None) -> tuple[CudaFacts, int, float] | None:
    """(what torch will say, the GPUs it will count, the smallest one's GiB), from its build, the
    GPUs `nvidia-smi` lists and `CUDA_VISIBLE_DEVICES`; None where only torch can tell (above)."""
    if build is None or build[2] is not None:  # not installed, or ROCm: torch decides
        return None
    version, cuda, _ = build
    if cuda is None:  # a CPU build sees no GPU, whatever the machine has
        return CudaFacts(torch=version, cuda=None, available=False, visible_devices=mask), 0, 0.0
    if smi is None or any(g.mig == "Enabled" for g in smi):
        return None
    n = visible_count(mask, len(smi))
    sizes = {g.memory_mib for g in smi}
    if n is None or (mask is not None and len(sizes) > 1):  # which GPUs a mask picks: CUDA's order
        return None
    driver = smi[0].driver if smi else None
    gib = min(sizes) / 1024 if n else 0.0
    facts = CudaFacts(torch=version, cuda=cuda, available=n > 0, driver=driver,
                      driver_from="nvidia-smi" if driver else "not found",
                      gpus=tuple(f"cuda:{i}" for i in range(n)), visible_devices=mask)
    return facts, n, gib


def query_host_cuda() -> tuple[CudaFacts, int, float] | None:
    """`host_cuda` of this machine (no torch imported)."""
    build = torch_build()
    smi = smi_gpus() if build is not None and build[1] is not None else None
    return host_cuda(build, smi, os.environ.get("CUDA_VISIBLE_DEVICES"))
