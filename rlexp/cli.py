"""`rlexp <command>`: one entry point dispatching to each command's `main(argv) -> int`."""
from __future__ import annotations

import importlib
import sys
from typing import NoReturn

from rlexp.core.fast_exit import fast_exit
from rlexp.errors import friendly_errors

COMMANDS = {
    "train": ("rlexp.train", "GRPO training through the Monarch actor graph (Hydra; --help lists groups)"),
    "eval": ("rlexp.evals.cli", "benchmark a model or a finished run: Math-500, GPQA Diamond, MMLU-Pro"),
    "doctor": ("rlexp.cluster.doctor", "torch's CUDA, the driver, the GPUs, each role's GPUs; refuses an old driver"),
    "plan": ("rlexp.cluster.plan_cli", "per-device memory estimate of a layout; refuses layouts that cannot fit"),
    "compare": ("rlexp.tracking.compare", "table + plots over run folders, sweeps, MLflow or W&B"),
    "reproduce": ("rlexp.tracking.reproduce", "re-run a run from its manifest and compare metrics exactly"),
    "bench": ("rlexp.bench", "generator tokens/s and weight-sync throughput against baselines"),
    "config-reference": ("rlexp.config.reference",
                         "every config key: type, default, meaning (docs/config.md)"),
}


def usage() -> str:
    lines = ["usage: rlexp <command> [args]", "", "commands:"]
    lines += [f"  {name:<16} {desc}" for name, (_, desc) in COMMANDS.items()]
    lines += ["", "`rlexp <command> --help` (or -h) lists a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"rlexp: unknown command {cmd!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[cmd][0])
    with friendly_errors():
        if cmd == "config-reference":  # the built-in backends' settings too (a layer below config)
            from rlexp.cluster.registry import job_settings

            return int(module.main(rest, job_settings()) or 0)
        return int(module.main(rest) or 0)


def run() -> NoReturn:
    """The process entry (the `rlexp` script, `python -m rlexp`): `main`, then an exit without
    the interpreter's teardown of torch's and Monarch's modules, seconds on a loaded machine
    after the run's last line (`rlexp.core.fast_exit`). An uncaught error still ends through
    the interpreter."""
    try:
        code: object = main()
    except SystemExit as e:
        code = e.code
    fast_exit(code)
