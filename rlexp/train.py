"""`rlexp train`: the Hydra task function. Returns final held-out accuracy (what sweepers optimise)."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import register_configs
from rlexp.errors import friendly_errors
from rlexp.run import refused, runlock
from rlexp.run.phases import Phases

register_configs()
_JOBS: list[None] = []  # one entry per task-function call in this process (a sweep runs several)


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def train(cfg: DictConfig) -> float:
    # The run folder's lock first: a second process on a live folder is refused before torch loads.
    with friendly_errors(interrupted=interrupted_hint), runlock.hold(Path(HydraConfig.get().runtime.output_dir)):
        # Imported here, not at the top: `rlexp train --help`, composition errors and a busy run folder must
        # not wait for torch and Monarch to load (which takes tens of seconds on a loaded machine: said first).
        phases = start_phases()
        from rlexp.cluster.host_plan import check_sizes

        check_sizes(cfg)  # sizes this machine cannot hold: refused before torch loads
        # a sweep's job: preflight saw each swept key's first value only
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            from rlexp.run.preflight import check_job

            check_job(cfg)
        from rlexp.run.launcher import run

        phases.done("torch and Monarch loaded")
        final = run(cfg, phases)
    return float(final.get("eval/accuracy", float("nan")))


def start_phases() -> Phases:
    """The start-up clock of one job. The first job of this process counts from the process's start (imports,
    composition); a sweep's later jobs from their own start, so their lines time that job alone (they used to
    show the whole sweep's time so far as "config composed")."""
    phases = Phases(since_start=not _JOBS)
    phases.done("started, config composed" if not _JOBS else f"job {len(_JOBS)} started, config composed")
    _JOBS.append(None)
    return phases


class RunFolderGuard(Callback):
    """Takes the run folder's lock, and notices a finished run under `resume=auto`, before Hydra writes
    `RUN_DIR/.hydra/` (which it does before the task function starts): a refused second process, or a
    finished run asked to resume, leaves the folder byte for byte as it was. Sweeps lock each job's folder in
    the task function (their `.hydra/` is per job). Redacts those copies as soon as Hydra wrote them."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()

    def on_run_start(self, config: DictConfig, **kwargs: object) -> None:
        run_dir = Path(str(config.hydra.run.dir)).absolute()
        if config.get("resume") == "auto" and run_dir.is_dir():
            from rlexp.run.checkpoints import check_finished_config, finished

            if (done := finished(run_dir, int(config.steps))) is not None:
                with friendly_errors():
                    check_finished_config(run_dir, config)
                print(f"[rlexp] {done}", flush=True)
                raise SystemExit(0)
        refused.note_created(run_dir)
        with friendly_errors():
            self.stack.enter_context(runlock.hold(run_dir))

    def on_multirun_start(self, config: DictConfig, **kwargs: object) -> None:
        """A sweep folder that exists already (a requeued or repeated sweep) is checked before Hydra writes in
        it or opens a job's log: each job's own lock checks that job's folder only after that."""
        from rlexp.core.runfolder import check_run_folder

        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        refused.note_sweep(sweep_dir)
        with friendly_errors():
            check_run_folder(sweep_dir)

    def on_job_start(self, config: DictConfig, **kwargs: object) -> None:
        """Hydra has just written `.hydra/*.yaml` with raw values: redact them before any check can refuse the
        run (a refused run never reaches the manifest, which redacts them again)."""
        from rlexp.tracking.hydra_run import redact_hydra_files

        rt = config.hydra.runtime
        sweep = str(config.hydra.sweep.dir) if config.hydra.mode == RunMode.MULTIRUN else None
        redact_hydra_files(Path(str(rt.output_dir)), sweep)
        if sweep is not None:  # a refused job's folder is removed if this invocation created it
            refused.note_job(Path(str(rt.output_dir)).absolute())

    def on_run_end(self, config: DictConfig, **kwargs: object) -> None:
        self.stack.close()


def interrupted_hint() -> str:
    """After Ctrl-C (teardown done, the manifest says interrupted): where the run is and how to go on."""
    from hydra.core.hydra_config import HydraConfig

    from rlexp.run.checkpoints import find_resume

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads((run_dir / "manifest.json").read_text()).get("status") == "completed":
            return f"run folder {run_dir}; the run had completed, only its teardown was cut short"
    last = find_resume("auto", run_dir)
    return (f"run folder {run_dir}; "
            + (f"continue from {last} with the same command plus resume=auto" if last else
               "no checkpoint was written yet (checkpoint.every_n_steps): start again with resume=restart"))


def main(argv: list[str]) -> int:
    from rlexp.core.plugins import with_config_path
    from rlexp.run.preflight import preflight, user_options_help

    # Every mistake that needs no torch is refused here, before Hydra creates the run folder; Hydra's flags go
    # first so that `--cfg job` works wherever it was typed.
    sys.argv = ["rlexp train", *preflight(with_config_path(argv))]
    try:
        train()
    except SystemExit as e:  # Hydra's --help ends with exit 0; its group list misses the user's folders
        if e.code in (0, None) and (mine := user_options_help(sys.argv[1:])) is not None:
            print(mine)
        # a refusal inside the run (or a sweep's job)
        if e.code == 2 and (gone := refused.remove_refused()) is not None:
            print(f"rlexp: {refused.removed_line(gone)}", file=sys.stderr)
        raise
    return 0
