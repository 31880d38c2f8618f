"""One Monarch worker per Slurm node (`srun python -m rlexp.cluster.jobs.slurm_worker`), what the
batch script of `cluster.job=slurm` runs instead of Monarch's one-line bootstrap, for two reasons:

* its port is `--port` plus the node's index in the job (`SLURM_NODEID`), so several nodes emulated
  on one host (Slurm's multiple-slurmd, the tests' two-node cluster) do not all bind Monarch's one
  port;
* a guard: the controller touches `--heartbeat` (a file in the run folder, on the filesystem the
  nodes share) every few seconds; once it has not changed for `--stale-s` seconds of this node's
  clock, the controller is gone (its host died with its reaper, or it was killed where no reaper
  ran), so the worker cancels its own job (`scancel $SLURM_JOB_ID`) and exits: no allocation
  outlives its controller by more than that bound. Only the file's changes are compared, never its
  time against this clock, so clocks that disagree across nodes do not matter."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

POLL_S = 2.0


def mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def guard(path: str, stale_s: float) -> None:
    """Return once `path` has not changed for `stale_s` seconds (a missing file: unchanged)."""
    last, since = mtime(path), time.monotonic()
    while True:
        time.sleep(POLL_S)
        now = mtime(path)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stale_s:
            return


def stop_job(path: str, stale_s: float) -> None:
    guard(path, stale_s)
    job = os.environ.get("SLURM_JOB_ID", "")
    print(
        f"[rlexp] the controller's heartbeat {path} has not changed for {stale_s:.0f} s: "
        f"the controller is gone; "
        f"cancelling Slurm job {job}",
        file=sys.stderr,
        flush=True,
    )
    if job.isdigit():
        try:
            subprocess.run(["scancel", job], timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"[rlexp] scancel {job}: {e}", file=sys.stderr, flush=True)
    os._exit(3)  # the step ends; Slurm ends what is left of it, and the batch script ends the job


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="rlexp.cluster.jobs.slurm_worker")
    ap.add_argument(
        "--port", type=int, required=True, help="node i listens on PORT + i (i = SLURM_NODEID)"
    )
    ap.add_argument(
        "--heartbeat", default="", help="the controller's heartbeat file; empty: no guard"
    )
    ap.add_argument("--stale-s", type=float, default=120.0)
    args = ap.parse_args(argv)
    if args.heartbeat and args.stale_s > 0:
        threading.Thread(target=stop_job, args=(args.heartbeat, args.stale_s), daemon=True).start()
    from monarch._src.job.service_identity import ranked_service_proc_id_from_env, service_proc_addr
    from monarch.actor import run_worker_loop_forever

    port = args.port + int(os.environ.get("SLURM_NODEID", "0"))
    address = service_proc_addr(
        f"tcp://{socket.gethostname()}:{port}",
        ranked_service_proc_id_from_env(rank_env="SLURM_NODEID"),
    )
    print(
        f"[rlexp] worker of node {os.environ.get('SLURMD_NODENAME', '?')} (index "
        f"{os.environ.get('SLURM_NODEID', '0')}) at {address}",
        file=sys.stderr,
        flush=True,
    )
    run_worker_loop_forever(address=address, ca="trust_all_connections")


if __name__ == "__main__":
    main()
