"""A process's GPUs, set when it is spawned, before anything in it imports torch.

Why: CUDA reads `CUDA_VISIBLE_DEVICES` once, when it initialises. Set inside an actor's `__init__`,
the mask comes too late whenever something in the process touched CUDA first, and every rank lands
on GPU 0. So the launcher (`rlexp.run.launcher.Graph.procs`) starts each process of a CUDA run with
Monarch's per-rank bootstrap command `python -m rlexp.core.gpu_mask` and `RLEXP_GPUS` set to the
GPUs rlexp's layout gives that rank (`rlexp.cluster.layout.gpu_layout`: indices on its host, counted
from 0). This module, the process's first code, maps them through the mask the process inherited (a
scheduler's: Slurm's `CUDA_VISIBLE_DEVICES=4,5,6,7` on a shared node makes rlexp's GPU 0 the
physical GPU 4), refuses an index beyond what is visible, sets `CUDA_VISIBLE_DEVICES`, records what
it did in `RLEXP_GPUS_APPLIED`, and then runs Monarch's own bootstrap. The actors check the record
(`check_mask`) instead of setting a mask themselves. A CPU run's processes start with it too, with
no `RLEXP_GPUS` (no mask), for its end: `main` leaves the process through `rlexp.core.fast_exit`.

Imports nothing of rlexp but `rlexp.core.fast_exit`, and not torch: it runs before them.
`spawn_masks`, the launcher's half (the command), imports Monarch when it is called.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

# rlexp's GPU indices on the host for this process ("0" or "2,3"), set at spawn
GPUS_ENV = "RLEXP_GPUS"
APPLIED_ENV = "RLEXP_GPUS_APPLIED"  # what `apply` mapped: "<indices>-><CUDA_VISIBLE_DEVICES>"
MONARCH_BOOTSTRAP = "monarch._src.actor.bootstrap_main"
MODULE = "rlexp.core.gpu_mask"


def spawn_masks(gpus: list[str]) -> Callable[[Any], Any]:
    """Monarch's per-rank bootstrap command for a mesh whose rank r gets GPU(s) `gpus[r]` (rlexp's
    indices on its host; none on CPU): `python -m rlexp.core.gpu_mask` with `RLEXP_GPUS`, which sets
    `CUDA_VISIBLE_DEVICES` through the scheduler's mask before Monarch's bootstrap, and before
    torch, runs, and ends the process without the interpreter's teardown. A mesh across hosts
    numbers its ranks host-major, as `gpus` does (`rlexp.cluster.layout.gpu_layout`)."""
    # Imported here: the bootstrap itself (`main`) must not load Monarch before its mask.
    import monarch.actor

    base = monarch.actor.default_bootstrap_cmd()

    def command(point: Any) -> Any:
        mask = gpus[point.rank] if gpus else None
        cmd = base.with_env({GPUS_ENV: mask, APPLIED_ENV: None})
        cmd.args = ["-m", MODULE]
        return cmd

    return command


class MaskError(RuntimeError):
    """A process cannot get the GPUs the layout gives it; the message names the mask and the fix."""


def through_mask(indices: str, inherited: str | None) -> str:
    """`indices` (rlexp's, counted from 0 on the host) as a `CUDA_VISIBLE_DEVICES` value under the
    `inherited` mask: position k of a scheduler's mask is rlexp's GPU k. Without a mask the indices
    are the GPUs themselves."""
    wanted = [i.strip() for i in indices.split(",") if i.strip()]
    if not wanted or not all(i.isdigit() for i in wanted):
        raise MaskError(f"{GPUS_ENV}={indices!r}: expected GPU indices like '0' or '2,3'")
    if inherited is None:
        return ",".join(wanted)
    visible = [v.strip() for v in inherited.split(",") if v.strip()]
    over = [i for i in wanted if int(i) >= len(visible)]
    if over:
        raise MaskError(f"this process is to use GPU(s) {indices} of its host (rlexp counts the "
                        f"GPUs it may use from 0), but the scheduler's mask "
                        f"CUDA_VISIBLE_DEVICES={inherited!r} shows {len(visible)}: ask the "
                        f"scheduler for more GPUs per host (Slurm: --gpus-per-node), or lower "
                        f"cluster.gpus_per_host and the layout until `rlexp plan` fits it")
    return ",".join(visible[int(i)] for i in wanted)


def apply(environ: MutableMapping[str, str] = os.environ,
          modules: Mapping[str, Any] = sys.modules) -> str | None:
    """Set this process's mask from `RLEXP_GPUS` (nothing when unset: a CPU run); the mask set, or
    None. Refuses when CUDA is already initialised here: the mask would be ignored. Idempotent."""
    indices = environ.get(GPUS_ENV)
    if indices is None:
        return None
    torch = modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise MaskError(f"CUDA was initialised in this process before its GPU mask "
                        f"({GPUS_ENV}={indices}) was set, so it would be ignored: the mask must be "
                        f"applied by `python -m {MODULE}`, the process's first code, before "
                        f"anything imports torch")
    done = environ.get(APPLIED_ENV, "")
    applied, _, mask = done.partition("->")
    if applied == indices and environ.get("CUDA_VISIBLE_DEVICES") == mask:
        return environ["CUDA_VISIBLE_DEVICES"]
    mask = through_mask(indices, environ.get("CUDA_VISIBLE_DEVICES"))
    environ["CUDA_VISIBLE_DEVICES"] = mask
    environ[APPLIED_ENV] = f"{indices}->{mask}"
    return mask


def check_mask(expected: str | None, environ: Mapping[str, str] = os.environ) -> None:
    """In an actor's `__init__`: this process was spawned with GPU(s) `expected` (rlexp's indices;
    None: a CPU process, nothing to check), the mask was applied at spawn, before torch, and nothing
    changed it since."""
    if expected is None:
        return
    done = environ.get(APPLIED_ENV, "")
    indices, _, mask = done.partition("->")
    if indices != expected:
        raise MaskError(f"this process was to run on GPU(s) {expected}, but its mask was not set "
                        f"when it was spawned ({APPLIED_ENV}={done or 'unset'}): spawn it with "
                        f"`rlexp.run.launcher.Graph.procs`, which starts it with `python -m "
                        f"{MODULE}` and {GPUS_ENV} per rank")
    if environ.get("CUDA_VISIBLE_DEVICES") != mask:
        raise MaskError(f"CUDA_VISIBLE_DEVICES was changed after spawn ({mask!r} -> "
                        f"{environ.get('CUDA_VISIBLE_DEVICES')!r}): nothing in an actor may set it")


def main() -> None:
    """The bootstrap: the mask, then Monarch's process main (its argv untouched), then an exit
    without the interpreter's teardown (`rlexp.core.fast_exit`: over a second of CPU in a process
    that imported torch and TorchTitan, paid while the run waits for its processes to stop)."""
    try:
        apply()
    except MaskError as e:
        print(f"[rlexp] {e}", file=sys.stderr, flush=True)
        raise SystemExit(3) from None
    import runpy

    from rlexp.core.fast_exit import fast_exit

    try:  # Monarch's main ends with sys.exit(its status) once every actor here has stopped
        runpy.run_module(MONARCH_BOOTSTRAP, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        fast_exit(e.code)
    fast_exit(0)


if __name__ == "__main__":
    main()
