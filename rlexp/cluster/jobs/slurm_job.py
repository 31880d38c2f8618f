"""Monarch 0.7's SlurmJob, adapted (a subclass here, not a patch of Monarch) to what a run on a real
Slurm needs:

* the job is read from `squeue --json` by its id, in the 22.05 layout and the newer one
  (`slurm_queue`);
* the batch script starts `rlexp.cluster.jobs.slurm_worker` on every node: port `port +
  SLURM_NODEID` (nodes emulated on one host do not collide) and a heartbeat guard that cancels the
  job once the controller is gone;
* the job's stdout/stderr go to `log_dir` (the run folder's `slurm/`), and a job that fails shows
  their last lines;
* a pending job says why (Slurm's reason, the nodes asked and the partition's), and one that has not
  started by `job_start_timeout` is cancelled with that message;
* while the run lasts, a thread touches the heartbeat and watches the job: one ended from outside
  (`scancel`, a time limit, a node failure) is announced at once, with the `resume=auto` command.

Every job carries `--comment=<OWNER_TAG><host>:<controller owner id>`, which the reaper
(rlexp/cluster/reaper.py) uses to cancel it once the controller is gone, even when it died while
`sbatch` was still submitting."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from monarch._src.job.service_identity import (
    SERVICE_PROC_IDS_ENV,
    serialize_service_proc_ids,
    service_proc_addrs,
)
from monarch._src.job.slurm import SlurmJob
from monarch.actor import attach_to_workers
from monarch.job import JobState

from rlexp.cluster.jobs import slurm_queue as q
from rlexp.errors import RunStopped

HEARTBEAT_S = 5.0  # how often the controller touches its heartbeat file
WATCH_S = 10.0  # how often it asks squeue whether the job still runs
PENDING_SAY_S = 30.0  # how often a pending job's reason is repeated
# squeue is asked whether the job started every START_POLL_S for its first START_FAST_S (an idle
# partition starts it within about a second, and the run waits out each poll), then every second.
START_POLL_S = 0.25
START_FAST_S = 5.0


def tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return []


class RlexpSlurmJob(SlurmJob):
    def __init__(
        self,
        meshes: dict[str, int],
        *,
        log_dir: str,
        comment: str,
        heartbeat_timeout_s: int,
        **kw: Any,
    ) -> None:
        super().__init__(meshes, log_dir=log_dir, **kw)
        self._comment = comment
        self._stale_s = heartbeat_timeout_s
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # --- paths ------------------------------------------------------------------------------------
    @property
    def heartbeat(self) -> Path:
        return Path(self._log_dir) / "heartbeat"

    def log_paths(self, job_id: str) -> tuple[Path, Path]:
        return Path(self._log_dir) / f"{job_id}.out", Path(self._log_dir) / f"{job_id}.err"

    def error_lines(self, job_id: str) -> str:
        out, err = self.log_paths(job_id)
        lines = tail(err) or tail(out)
        where = f"(all of it in {err} and {out})"
        return (
            ("\nthe job's last lines " + where + ":\n    " + "\n    ".join(lines))
            if lines
            else f"\n{where}"
        )

    # --- submission -------------------------------------------------------------------------------
    def _submit_slurm_job(self, num_nodes: int, client_script: str | None = None) -> str:
        if client_script is not None:
            raise NotImplementedError(
                "rlexp runs its controller outside the allocation (no batch mode)"
            )
        self._ensure_service_proc_ids(num_nodes)
        os.makedirs(self._log_dir, exist_ok=True)
        self.heartbeat.touch()
        self._start_watch()
        out, err = (Path(self._log_dir) / "%j.out", Path(self._log_dir) / "%j.err")
        d = [
            f"--job-name={self._job_name}_{os.getpid()}",
            f"--comment={self._comment}",
            "--export=ALL",
            f"--nodes={num_nodes}",
            f"--ntasks-per-node={self._ntasks_per_node}",
            f"--output={out}",
            f"--error={err}",
        ]
        for flag, value in (
            ("time", self._time_limit),
            ("gpus-per-node", self._gpus_per_node),
            ("cpus-per-task", self._cpus_per_task),
            ("mem", self._mem),
            ("partition", self._partition),
            ("account", self._account),
            ("qos", self._qos),
        ):
            if value is not None:
                d.append(f"--{flag}={value}")
        if self._exclusive:
            d.append("--exclusive")
        d += [a for a in self._slurm_args if a.startswith("-")]
        worker = [
            self._python_exe,
            "-m",
            "rlexp.cluster.jobs.slurm_worker",
            "--port",
            str(self._port),
            "--heartbeat",
            str(self.heartbeat),
            "--stale-s",
            str(self._stale_s),
        ]
        script = "\n".join(
            [
                "#!/bin/bash",
                *(f"#SBATCH {shlex.quote(x)}" for x in d),
                f"export {SERVICE_PROC_IDS_ENV}="
                f"{shlex.quote(serialize_service_proc_ids(self._service_proc_ids))}",
                f"exec srun --kill-on-bad-exit=1 {shlex.join(worker)}",
                "",
            ]
        )
        (Path(self._log_dir) / "batch.sh").write_text(script)
        res = subprocess.run(
            ["sbatch", "--parsable"], input=script, capture_output=True, text=True, timeout=120
        )
        if res.returncode != 0:
            raise RunStopped(
                f"sbatch refused the job: {res.stderr.strip()} (the script: "
                f"{Path(self._log_dir) / 'batch.sh'}; site values are cluster.job_options.*)"
            )
        job_id = res.stdout.strip().split(";")[0]
        print(
            f"[rlexp] Slurm job {job_id} submitted ({num_nodes} node(s)); "
            f"its output: {self._log_dir}/",
            file=sys.stderr,
            flush=True,
        )
        return job_id

    def _get_job_info_json(self, job_id: str) -> dict[str, Any] | None:
        return q.query(job_id)

    # --- start ------------------------------------------------------------------------------------
    def _wait_for_job_start(
        self, job_id: str, expected_nodes: int, timeout: int | None = None
    ) -> list[str]:
        start, said, last = time.monotonic(), 0.0, ""
        try:
            while True:
                job = q.query(job_id)
                if job is None:
                    raise RunStopped(
                        f"Slurm job {job_id} left the queue before it ran{self.error_lines(job_id)}"
                    )
                st = q.states(job)
                if "RUNNING" in st:
                    names = q.node_names(job)
                    if len(names) != expected_nodes:
                        raise RuntimeError(
                            f"Slurm job {job_id} runs on {names}, {expected_nodes} nodes expected"
                        )
                    return names
                if q.ended(st):
                    raise RunStopped(
                        f"Slurm job {job_id} ended before it ran: {'/'.join(st)}"
                        f"{' (' + q.reason(job) + ')' if q.reason(job) else ''}"
                        f"{self.error_lines(job_id)}"
                    )
                waited = time.monotonic() - start
                if timeout is not None and waited > timeout:
                    raise RunStopped(
                        f"Slurm job {job_id} did not start within {timeout} s: "
                        f"{q.describe_pending(job)}. It is cancelled. Ask for fewer nodes "
                        f"(cluster.hosts_per_role) or another partition "
                        f"(cluster.job_options.partition), or wait longer "
                        f"(cluster.job_options.start_timeout_s)"
                    )
                now = q.describe_pending(job) if "PENDING" in st else "/".join(st)
                if waited >= 3 and (
                    now != last or waited - said > PENDING_SAY_S
                ):  # not for a job about to run
                    print(
                        f"[rlexp] Slurm job {job_id} {now} (waited {waited:.0f} s of "
                        f"{timeout if timeout is not None else 'unlimited'})",
                        file=sys.stderr,
                        flush=True,
                    )
                    said, last = waited, now
                time.sleep(START_POLL_S if waited < START_FAST_S else 1.0)
        except BaseException:
            self._kill()
            raise

    def _state(self) -> JobState:
        """Monarch's `_state`: node i's worker at its NodeHostname, port `port + i`."""
        job_id = self._resolved_job_id()
        if job_id is None:
            raise RuntimeError("the Slurm job was not submitted")
        if not self._all_hostnames:
            self._all_hostnames = self._wait_for_job_start(
                job_id, sum(self._meshes.values()), timeout=self._job_start_timeout
            )
        hosts = q.node_hostnames(self._all_hostnames)
        meshes, i = {}, 0
        for name, n in self._meshes.items():
            workers = [f"tcp://{hosts[k]}:{self._port + k}" for k in range(i, i + n)]
            meshes[name] = attach_to_workers(
                name=name,
                ca="trust_all_connections",
                workers=service_proc_addrs(workers, self._service_proc_ids[i : i + n]),
            )
            i += n
        return JobState(meshes)

    # --- while it runs ----------------------------------------------------------------------------
    def _start_watch(self) -> None:
        self._stop.clear()
        self._watcher = threading.Thread(target=self._watch, name="rlexp-slurm-watch", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """Touch the heartbeat; say at once when the job ends from outside (not by `kill`)."""
        last_check = time.monotonic()
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.heartbeat)
            except OSError:
                self.heartbeat.touch()
            job_id = self._slurm_job_id
            if job_id is None or time.monotonic() - last_check < WATCH_S:
                continue
            last_check = time.monotonic()
            try:
                job = q.query(job_id)
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                continue  # the controller's squeue is down for a moment: the workers say the rest
            st = q.states(job) if job is not None else ["GONE"]
            if (job is None or q.ended(st)) and not self._stop.is_set():
                print(
                    f"\n[rlexp] Slurm job {job_id} ended outside this run: {'/'.join(st)}"
                    f"{' (' + q.reason(job) + ')' if job and q.reason(job) else ''}; its hosts are "
                    f"gone, so the run stops. Continue it with the same command plus resume=auto "
                    f"(from its last checkpoint)"
                    f"{self.error_lines(job_id)}",
                    file=sys.stderr,
                    flush=True,
                )
                return

    def _kill(self) -> None:
        self._stop.set()
        super()._kill()
