"""No process and no socket folder outlives a run on simulated hosts (`cluster=process`), whenever its controller
dies: `kill -9` at start-up (the first host just spawned), while the engines load, mid-run and during teardown,
and a double Ctrl-C, which ends in one line (exit 130), not a traceback. The reaper itself (rlexp/cluster/reaper.py)
is first checked on plain processes: a host that appears after its controller died is killed too.

Every process of a test run carries RLEXP_TEST_TAG (tests/conftest.py), the reaper included, and the run gets
a temp directory of its own, so that every `monarch_process_job_*` folder in it is the run's."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlexp.cluster import reaper
from tests.conftest import REPO, tagged_env, tagged_pids, wait_no_orphans

LAYOUT = ["cluster=process", "generator.replicas=2", "cluster.hosts_per_role.generator=2", "cluster.hosts=4",
          "eval.every_n_steps=0", "checkpoint.save_final=false"]
CLEAN_S = 20.0  # the bound on "no process left": the reaper polls every 0.5 s


def socket_folders(tmp: Path) -> list[str]:
    return sorted(d.name for d in tmp.glob(f"{reaper.FOLDER_PREFIX}*"))


def wait_clean(tag: str, tmp: Path, since: float) -> tuple[list[int], list[str], float]:
    """(processes left, socket folders left, seconds from `since` until none of either was left)."""
    left = wait_no_orphans(tag, timeout=CLEAN_S)
    deadline = time.time() + 5  # the reaper removes the folder right after the last kill
    while socket_folders(tmp) and time.time() < deadline:
        time.sleep(0.2)
    return left, socket_folders(tmp), time.time() - since


# --- the reaper on plain processes (seconds, no Monarch) --------------------------------------------------
LATE_ENV = "RLEXP_TEST_LATE_PROC"  # the late proc's only variable: its test's tag
FAKE_CONTROLLER = textwrap.dedent("""
    import os, subprocess, sys, time
    from rlexp.cluster import reaper
    folder = sys.argv[1]
    owner = reaper.owner_id()
    reaper.start(owner)
    env = {**os.environ, reaper.OWNER_ENV: owner, reaper.ADDR_ENV: "x@ipc://" + folder + "/generator_0"}
    host = subprocess.Popen([sys.executable, "-c", sys.argv[2], str(os.getpid()), *sys.argv[3:]],
                            env=env, start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert host.stdout.readline().strip() == "ready"
    print("spawned", flush=True)
    time.sleep(300)
""")
# A host (own session, like Monarch's) that starts a proc in a process group of its own the moment
# its controller is dead, so before the reaper can have seen it. The proc carries neither the owner
# mark nor the test's tag, only LATE_ENV (which the reaper never reads): the test finds it by that,
# and no other `sleep 300` on the machine. Its pid goes to a file: the proof that it was started.
FAKE_HOST = textwrap.dedent("""
    import os, subprocess, sys, time
    controller, late_env, tag, pid_file = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    print("ready", flush=True)
    while os.getppid() == controller:
        time.sleep(0.005)
    late = subprocess.Popen(["sleep", "300"], process_group=0, env={late_env: tag})
    with open(pid_file, "w") as f:
        f.write(str(late.pid))
    time.sleep(300)
""")


def test_kill_9_of_a_controller_ends_its_hosts_and_procs_spawned_after_it_died(tmp_path: Path, tag: str) -> None:
    folder = tmp_path / f"{reaper.FOLDER_PREFIX}abc"
    folder.mkdir()
    (folder / "generator_0").write_text("")
    env = {**tagged_env(tag), "PYTHONPATH": str(REPO)}
    late_pid = tmp_path / "late.pid"
    ctl = subprocess.Popen([sys.executable, "-c", FAKE_CONTROLLER, str(folder), FAKE_HOST, LATE_ENV,
                            tag, str(late_pid)], env=env, stdout=subprocess.PIPE, text=True)
    assert ctl.stdout.readline().strip() == "spawned"
    ctl.kill()
    ctl.wait()
    t0 = time.time()
    assert wait_no_orphans(tag, timeout=CLEAN_S) == []  # the host, the reaper (late proc: no tag)
    assert time.time() - t0 < 10
    assert not folder.exists()
    assert late_pid.exists()  # the late proc was started, after the controller died
    assert _late_procs(tag) == []  # this test's only: another `sleep 300` on the machine is not


def _late_procs(tag: str) -> list[int]:
    """Live processes whose environment is exactly FAKE_CONTROLLER's late proc's, for this `tag`."""
    want = [f"{LATE_ENV}={tag}".encode()]
    out = []
    for p in Path("/proc").iterdir():
        try:
            if (p.name.isdigit() and (p / "environ").read_bytes().split(b"\0")[:-1] == want
                    and (p / "stat").read_text().split(") ")[-1].split()[0] != "Z"):  # not a zombie
                out.append(int(p.name))
        except OSError:
            continue
    return out


def wait_handled(pid: int, sig: int, timeout: float = 15) -> None:
    """Until process `pid` has a handler for `sig` and no longer blocks it (/proc/<pid>/status)."""
    bit, deadline = 1 << (sig - 1), time.time() + timeout
    while time.time() < deadline:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        masks = dict(x.split(":\t", 1) for x in status if x.startswith(("SigCgt", "SigBlk")))
        if int(masks["SigCgt"], 16) & bit and not int(masks["SigBlk"], 16) & bit:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} did not handle signal {sig} within {timeout} s")


def test_the_reaper_exits_with_its_controller_and_leaves_other_jobs_alone(tmp_path: Path, tag: str) -> None:
    """A controller that ends normally ends its reaper (SIGUSR1); a live controller's hosts are not touched
    by another run's start-up sweep (`clean_stale`), a dead one's are."""
    env = {**tagged_env(tag), "PYTHONPATH": str(REPO)}
    live = subprocess.Popen(["sleep", "300"], env=env)
    other = subprocess.Popen(["sleep", "300"], env={**env, reaper.OWNER_ENV: reaper.owner_id(live.pid)},
                             start_new_session=True)
    orphan = subprocess.Popen(["sleep", "300"], env={**env, reaper.OWNER_ENV: f"{live.pid}:not-its-start-time"},
                              start_new_session=True)
    r = reaper.start(reaper.owner_id())
    wait_handled(r.pid, signal.SIGUSR1)  # a controller ends long after its reaper is ready
    r.send_signal(signal.SIGUSR1)
    assert r.wait(timeout=15) == 0
    reaper.clean_stale(tmp_path)
    assert orphan.wait(timeout=5) == -signal.SIGKILL  # its owner pid was reused: a dead owner
    assert other.poll() is None
    live.kill()
    reaper.clean_stale(tmp_path)
    assert other.wait(timeout=5) == -signal.SIGKILL
    live.wait()


def test_stale_socket_folders_go_at_the_next_start(tmp_path: Path, tag: str) -> None:
    old = tmp_path / f"{reaper.FOLDER_PREFIX}old"
    used = tmp_path / f"{reaper.FOLDER_PREFIX}used"
    young = tmp_path / f"{reaper.FOLDER_PREFIX}young"
    other = tmp_path / "not_monarch"
    for d in (old, used, young, other):
        d.mkdir()
    past = time.time() - 2 * reaper.STALE_FOLDER_S
    for d in (old, used, other):
        os.utime(d, (past, past))
    user = subprocess.Popen(["sleep", "300"], env={**tagged_env(tag), reaper.ADDR_ENV: f"ipc://{used}/trainer_0"})
    try:
        reaper.clean_stale(tmp_path)
        assert sorted(d.name for d in tmp_path.iterdir()) == sorted([used.name, young.name, other.name])
    finally:
        user.kill()
        user.wait()


# --- through the CLI, with real Monarch hosts -------------------------------------------------------------
class Run:
    """`rlexp train` on simulated hosts in a session of its own (like a terminal's job), with its own temp
    directory; its output goes to a file, read while it runs."""

    def __init__(self, tmp_path: Path, tag: str, steps: int) -> None:
        self.dir, self.tmp, self.log = tmp_path / "run", tmp_path / "tmp", tmp_path / "out.txt"
        self.tmp.mkdir()
        env = {**tagged_env(tag), "TMPDIR": str(self.tmp)}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "rlexp", "train", *LAYOUT, f"steps={steps}",
                                          f"hydra.run.dir={self.dir}"], cwd=REPO, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def out(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str = "", step: int = 0, timeout: float = 300) -> None:
        """Until the output shows `text`, or metrics.jsonl has `step`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text and text in self.out():
                return
            if step and any(r["step"] >= step for r in metrics_rows(self.dir)):
                return
            assert self.proc.poll() is None, f"run ended before {text or step!r}:\n{self.out()[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"{text or step!r} not seen in {timeout}s:\n{self.out()[-3000:]}")


    def kill_at_first_host(self, timeout: float = 300) -> None:
        """SIGKILL the controller the moment its first simulated host process exists (polled every few ms),
        while Monarch is still spawning the others."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for children in Path(f"/proc/{self.proc.pid}/task").glob("*/children"):
                for pid in children.read_text().split():
                    try:
                        host = b"run_worker_loop_forever" in Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if host:
                        self.proc.kill()
                        return
            assert self.proc.poll() is None, f"run ended before a host was spawned:\n{self.out()[-3000:]}"
            time.sleep(0.002)
        raise AssertionError(f"no host spawned in {timeout}s")


def metrics_rows(run: Path) -> list[dict]:
    f = run / "metrics.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []  # every line whole


@pytest.mark.slow
@pytest.mark.parametrize(("moment", "steps", "line", "step"), [
    ("first host spawned", 2, "", 0),
    ("engines loading", 2, "Job is running", 0),
    ("mid-run", 1000, "", 2),
    ("teardown", 2, "[rlexp] done:", 0),
])
def test_kill_9_of_the_controller_at_any_moment_leaves_nothing(tmp_path: Path, tag: str, moment: str, steps: int,
                                                               line: str, step: int) -> None:
    run = Run(tmp_path, tag, steps)
    try:
        run.wait_for(line, step) if line or step else run.kill_at_first_host()
    finally:
        run.proc.kill()
        run.proc.wait()
    left, folders, took = wait_clean(tag, run.tmp, time.time())
    print(f"kill -9 at {moment}: {len(left)} processes, {len(folders)} socket folders left; clean in {took:.1f}s")
    assert left == [] and folders == []


@pytest.mark.slow
def test_double_ctrl_c_ends_in_one_line_and_leaves_nothing(tmp_path: Path, tag: str) -> None:
    run = Run(tmp_path, tag, steps=100000)
    run.wait_for(step=2)
    assert tagged_pids(tag)  # the hosts are up
    os.killpg(run.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the controller's whole process group
    run.wait_for("stopping after this step", timeout=60)
    os.killpg(run.proc.pid, signal.SIGINT)
    run.proc.wait(timeout=120)
    t0 = time.time()
    out = run.out()
    assert run.proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert f"rlexp: interrupted; run folder {run.dir}" in out.strip().splitlines()[-1]
    assert json.loads((run.dir / "manifest.json").read_text())["status"] == "interrupted"
    assert metrics_rows(run.dir)[-1]["step"] >= 2
    left, folders, took = wait_clean(tag, run.tmp, t0)
    print(f"double Ctrl-C: {len(left)} processes, {len(folders)} socket folders left; clean in {took:.1f}s")
    assert left == [] and folders == []
