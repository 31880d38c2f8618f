"""No simulated host outlives its controller: a reaper process, armed before the first host exists.

Monarch's ProcessJob starts each simulated host in a session of its own (so Ctrl-C in the terminal does not
reach it), which also means a controller killed with `kill -9` leaves its hosts running. The controller
therefore marks its job before spawning anything: every host process gets `OWNER_ENV=<controller pid>:<its
start time>` in its environment, and the procs a host starts stay in the host's session. The reaper (a
process of its own session, started first) learns those sessions as the hosts appear, and once the
controller is gone (or says it is done, SIGUSR1) kills every process that carries the mark or lives in a
learned session, until a few sweeps in a row find none: a host that was being spawned when the controller
died appears a moment later and is killed too. Then it removes the job's socket folder
(`<tmp>/monarch_process_job_*`, named in each host's `_MONARCH_WORKER_ADDR`).

A Slurm job (`cluster.job=slurm`) has no process here: its batch script carries the mark instead
(`--comment=rlexp-owner:<host>:<owner>`, `slurm_mark`), and the reaper, started for Slurm before
`sbatch`, cancels every job of this user with that mark once the controller is gone, again until a
few sweeps in a row find none (a `sbatch` still in flight when the controller died submits a moment
later). `cancel_stale_slurm_jobs` does the same at the next start for marks of this host whose
controller is dead.

`clean_stale` does the same for owners that are dead at the next start, should a reaper itself have been
killed, and removes socket folders no live process uses. The pid in the mark is checked with its start time,
so a reused pid is not taken for a live controller.
"""
from __future__ import annotations

import contextlib
import getpass
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

OWNER_ENV = "RLEXP_JOB_OWNER"
ADDR_ENV = "_MONARCH_WORKER_ADDR"  # set by Monarch's ProcessJob in each host's environment
FOLDER_PREFIX = "monarch_process_job_"
STALE_FOLDER_S = 60.0  # an unused socket folder younger than this may be a starting job's: left alone
QUIET_SWEEPS = 3  # sweeps in a row that find nothing before the reaper is sure all is gone


def owner_id(pid: int | None = None) -> str:
    """`<pid>:<start time>`: names one process for its whole life, whatever later reuses the pid."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{_start_time(pid)}"


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: [state, ppid, ...]; empty when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _start_time(pid: int) -> str:
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else "?"


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X", "x")


def owner_alive(owner: str) -> bool:
    pid, _, start = owner.partition(":")
    return pid.isdigit() and _alive(int(pid)) and _start_time(int(pid)) == start


def _processes() -> Iterator[tuple[int, dict[str, str]]]:
    """(pid, environment) of every live process this user can read, but this one."""
    me = os.getpid()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        try:
            raw = (p / "environ").read_bytes()
        except OSError:
            continue
        if _alive(int(p.name)):
            env = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
            yield int(p.name), env


def socket_folder(env: dict[str, str]) -> Path | None:
    """The ProcessJob socket folder a host process listens in, from its `_MONARCH_WORKER_ADDR`
    (`[<proc id>@]ipc://<tmp>/monarch_process_job_xxx/<host>`)."""
    addr = env.get(ADDR_ENV, "")
    if "ipc://" not in addr:
        return None
    folder = Path(addr.split("ipc://", 1)[1]).parent
    return folder if folder.name.startswith(FOLDER_PREFIX) else None


class Job:
    """What the reaper has learned of one owner's job: its hosts' sessions and socket folders."""

    def __init__(self, owners: set[str] | None = None) -> None:
        self.owners = owners  # None: every owner that is dead (`clean_stale`)
        self.sessions: set[int] = set()
        self.folders: set[Path] = set()

    def _ours(self, env: dict[str, str]) -> bool:
        owner = env.get(OWNER_ENV)
        if owner is None:
            return False
        return owner in self.owners if self.owners is not None else not owner_alive(owner)

    def learn(self) -> list[int]:
        """Note the sessions and socket folders of every marked process now alive; returns the processes
        to kill: the marked ones and all others in their sessions."""
        procs = list(_processes())
        marked = []
        for pid, env in procs:
            if self._ours(env):
                marked.append(pid)
                with contextlib.suppress(OSError):
                    if os.getsid(pid) == pid:  # a host leads a session of its own; never learn a shared one
                        self.sessions.add(pid)
                folder = socket_folder(env)
                if folder is not None:
                    self.folders.add(folder)
        rest = []
        for pid, _ in procs:
            with contextlib.suppress(OSError):
                if pid not in marked and os.getsid(pid) in self.sessions:
                    rest.append(pid)
        return marked + rest

    def kill(self, max_sweeps: int = 100) -> int:
        """SIGKILL until `QUIET_SWEEPS` sweeps in a row find nothing; remove the socket folders. Returns the
        number of processes killed."""
        killed, quiet = 0, 0
        for _ in range(max_sweeps):
            pids = self.learn()
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            killed += len(pids)
            quiet = 0 if pids else quiet + 1
            if quiet >= QUIET_SWEEPS:
                break
            time.sleep(0.2)
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)
        return killed


def clean_stale(tmp: Path | None = None) -> None:
    """Kill the hosts of dead controllers (their reaper was killed too), and remove the socket folders no
    live process uses: those of jobs that ended without teardown (kill -9, a double Ctrl-C)."""
    Job().kill()
    tmp = Path(tempfile.gettempdir()) if tmp is None else tmp
    used = {folder for _, env in _processes() if (folder := socket_folder(env)) is not None}
    with contextlib.suppress(OSError):
        for d in tmp.iterdir():
            if not d.name.startswith(FOLDER_PREFIX) or d in used:
                continue
            with contextlib.suppress(OSError):
                st = d.lstat()
                if st.st_uid == os.getuid() and time.time() - st.st_mtime > STALE_FOLDER_S:
                    shutil.rmtree(d, ignore_errors=True)


SLURM_MARK = "rlexp-owner:"


def slurm_mark(owner: str) -> str:
    """The comment a Slurm job of `owner` carries: this host's name and the owner id."""
    return f"{SLURM_MARK}{socket.gethostname()}:{owner}"


def _slurm_jobs() -> list[tuple[str, str]]:
    """(job id, comment) of this user's queued or running Slurm jobs; [] without Slurm."""
    cmd = ["squeue", "-h", "-u", getpass.getuser(), "-t", "PD,R,CF,S", "-o", "%i %k"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = [line.split(" ", 1) for line in out.stdout.splitlines() if " " in line]
    return [(job, mark) for job, mark in rows]


def cancel_slurm(marks: set[str] | None, quiet_sweeps: int = QUIET_SWEEPS,
                 pause_s: float = 0.5) -> list[str]:
    """`scancel` the jobs carrying one of `marks` (None: marks of this host whose owner is dead),
    until `quiet_sweeps` sweeps in a row find none. Returns the job ids cancelled."""
    here = f"{SLURM_MARK}{socket.gethostname()}:"
    cancelled: list[str] = []
    quiet = 0
    for _ in range(60):
        ours = [j for j, mark in _slurm_jobs()
                if (mark in marks if marks is not None else
                    mark.startswith(here) and not owner_alive(mark.removeprefix(here)))
                and j not in cancelled]
        for j in ours:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(["scancel", j], capture_output=True, timeout=30)
        cancelled += ours
        quiet = 0 if ours else quiet + 1
        if quiet >= quiet_sweeps:
            break
        time.sleep(pause_s)
    return cancelled


def cancel_stale_slurm_jobs() -> list[str]:
    """At a start: cancel the Slurm jobs of this host's dead controllers (their reaper died too)."""
    return cancel_slurm(None, quiet_sweeps=1)


def start(owner: str, slurm: bool = False) -> subprocess.Popen:
    """The reaper for `owner`'s job, in a session of its own so that the signals that end the controller
    (a terminal's Ctrl-C, `kill -9` of its process group) do not end it too. `slurm`: it also
    cancels the owner's Slurm jobs."""
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    # `-c`, not `-m rlexp.cluster.reaper`: the package imports this module first (runpy warns).
    # SIGUSR1 is blocked until `reap` handles it: one sent while the imports run waits, not kills.
    code = ("import signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1}); "
            "import sys; from rlexp.cluster.reaper import reap; "
            "reap(sys.argv[1], slurm=sys.argv[2] == 'slurm')")
    kind = "slurm" if slurm else "processes"
    return subprocess.Popen([sys.executable, "-c", code, owner, kind], env=env,
                            start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)


def reap(owner: str, poll_s: float = 0.5, slurm: bool = False) -> None:
    """Wait until `owner` is gone (or SIGUSR1 arrives: the controller tore its job down), then kill whatever
    of its job is left and remove its socket folders."""
    stop = [False]
    signal.signal(signal.SIGUSR1, lambda *_: stop.__setitem__(0, True))
    # SIGUSR1 also writes to this pipe, which ends the wait between polls at once: the controller
    # waits on this process's exit, which would otherwise come up to `poll_s` later.
    wake, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    job = Job({owner})
    while not stop[0] and owner_alive(owner):
        job.learn()
        if select.select([wake], [], [], poll_s)[0]:
            os.read(wake, 512)
    if slurm:  # after SIGUSR1 the controller's sbatch has returned: no job can land later
        cancel_slurm({slurm_mark(owner)}, quiet_sweeps=1 if stop[0] else QUIET_SWEEPS)
    job.kill()
    clean_stale()


if __name__ == "__main__":
    reap(sys.argv[1], slurm="--slurm" in sys.argv[2:])
