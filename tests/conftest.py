"""Shared helpers for tests that run `rlexp` as a user would: a subprocess per command."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
# No test reaches the Hugging Face Hub: offline unless a test points the hub at a closed local port itself.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def tagged_env(tag: str) -> dict[str, str]:
    """Environment carrying a unique tag: every process the run spawns inherits it, so leftovers are findable."""
    env = dict(os.environ)
    env["RLEXP_TEST_TAG"] = tag
    env.setdefault("WANDB_MODE", "offline")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tagged_pids(tag: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if f"RLEXP_TEST_TAG={tag}".encode() in (p / "environ").read_bytes().split(b"\0"):
                stat = (p / "stat").read_text()
                if stat.split(") ")[-1].split()[0] != "Z":  # zombies are already dead
                    pids.append(int(p.name))
        except OSError:
            continue
    return pids


def wait_no_orphans(tag: str, timeout: float = 20.0) -> list[int]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = tagged_pids(tag)
        if not left:
            return []
        time.sleep(0.5)
    return tagged_pids(tag)


def kill_tagged(tag: str) -> None:
    for pid in tagged_pids(tag):
        with contextlib.suppress(OSError):  # already gone
            os.kill(pid, 9)


def rlexp(*args: str, tag: str | None = None, timeout: float = 600, check: bool = True,
          cwd: Path | None = None) -> subprocess.CompletedProcess:
    tag = tag or uuid.uuid4().hex
    proc = subprocess.run([sys.executable, "-m", "rlexp", *args], cwd=cwd or REPO, env=tagged_env(tag),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"rlexp {' '.join(args)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
                             f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture
def tag() -> str:
    t = uuid.uuid4().hex
    yield t
    kill_tagged(t)


# The default task for 6 steps, evaluated at 0, 3 and 6: the run `short_run` makes once per session.
SHORT = ["steps=6", "eval.every_n_steps=3", "algorithm.prompts_per_step=16",
         "algorithm.group_size=8"]


@dataclass(frozen=True)
class FinishedRun:
    run: Path  # its hydra.run.dir: metrics.jsonl, manifest.json, checkpoints/final
    shm: Path  # its cluster.shm_dir (empty once the run has ended)
    stdout: str
    tag: str  # every process it spawned carried this tag


@pytest.fixture(scope="session")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> FinishedRun:
    """One finished `rlexp train` of the default task (`SHORT`), for every test that only reads a
    finished default run: each `rlexp train` costs ~10 s of start-up on two cores, so tests share
    it. Read it, never write into it (a test that resumes or changes a run copies it first)."""
    base = tmp_path_factory.mktemp("short_run")
    tag = uuid.uuid4().hex
    try:
        p = rlexp("train", *SHORT, f"hydra.run.dir={base / 'run'}",
                  f"cluster.shm_dir={base / 'shm'}", tag=tag)
    except BaseException:
        kill_tagged(tag)
        raise
    return FinishedRun(base / "run", base / "shm", p.stdout, tag)



# ------------------------------------------------- Monarch's supervision poll (issue 44 item 6)
# Monarch reads its HYPERACTOR_* settings once, when its Rust bindings load. This pytest process's
# own meshes (tests/test_service_faults.py kills replicas in them) poll their processes' state every
# second instead of every ~10 s, so a kill is seen within about a second: the same supervision path,
# and nothing asserted depends on when. Taken out of the environment again at once: `rlexp train`
# subprocesses and every spawned process keep the product's default.
SUPERVISION_POLL = "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"
if SUPERVISION_POLL not in os.environ:
    os.environ[SUPERVISION_POLL] = "1s"
    try:
        import monarch._rust_bindings  # noqa: F401  (reads the setting now)
    finally:
        del os.environ[SUPERVISION_POLL]


# ------------------------------------------------- shared checkpointed run (issue 44 item 6)
# A run with a checkpoint and an evaluation at every step, made once per session by
# `checkpointed_run` and read by tests/test_run_folder_links.py (copies it, plants links,
# resumes it) and tests/test_run_integrity.py (a second `rlexp train` tried while it was live).
CHECKPOINTED = ["eval.every_n_steps=1", "checkpoint.every_n_steps=1",
                "algorithm.prompts_per_step=8"]
CHECKPOINTED_STEPS = 2


@dataclass(frozen=True)
class CheckpointedRun:
    run: Path  # finished: checkpoints at steps 1 and 2, eval samples, metrics.jsonl, manifest.json
    pid: int  # the `rlexp train` that made it
    returncode: int  # its exit status
    stderr: str
    # `rlexp train ... resume=auto` on the same folder while the first was live
    second: subprocess.CompletedProcess
    second_s: float  # how long the second took to be refused
    first_was_live: bool  # the first was still running when the second had ended
    manifest_kept: bool  # manifest.json then: byte for byte the first's, written before spawning
    overrides_kept: bool  # .hydra/overrides.yaml then: the first's (not Hydra's, with resume=auto)
    orphans: list[int]  # processes of the run still alive after it ended


@pytest.fixture(scope="session")
def checkpointed_run(tmp_path_factory: pytest.TempPathFactory) -> CheckpointedRun:
    """`rlexp train` of CHECKPOINTED_STEPS steps (CHECKPOINTED); once its manifest is written
    (under the run folder's lock, before anything spawns), the same command with resume=auto is
    started on the folder and recorded. Read it, never write into it: copy it to change it."""
    run = tmp_path_factory.mktemp("checkpointed_run") / "run"
    tag = uuid.uuid4().hex
    args = ["train", f"steps={CHECKPOINTED_STEPS}", *CHECKPOINTED, f"hydra.run.dir={run}"]
    first = subprocess.Popen([sys.executable, "-m", "rlexp", *args], cwd=REPO, env=tagged_env(tag),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not (run / "manifest.json").exists():
            if first.poll() is not None or time.time() > deadline:
                why = first.stderr.read()[-3000:] if first.poll() is not None else "slow"
                raise AssertionError(f"no manifest.json from `rlexp {' '.join(args)}`: {why}")
            time.sleep(0.2)
        started = (run / "manifest.json").read_bytes()
        overrides = (run / ".hydra" / "overrides.yaml").read_bytes()
        t = time.time()
        second = rlexp(*args, "resume=auto", check=False, tag=tag)
        second_s = time.time() - t
        live = first.poll() is None
        manifest_kept = (run / "manifest.json").read_bytes() == started
        overrides_kept = (run / ".hydra" / "overrides.yaml").read_bytes() == overrides
        _, err = first.communicate(timeout=600)
        orphans = wait_no_orphans(tag)
    finally:
        if first.poll() is None:
            first.kill()
        kill_tagged(tag)
    return CheckpointedRun(run, first.pid, first.returncode, err, second, second_s, live,
                           manifest_kept, overrides_kept, orphans)


@pytest.fixture
def offline_trackers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """W&B offline and MLflow local, with their caches inside the test's folder: nothing leaves the machine."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))


def load_script(name: str) -> Any:
    """scripts/<name>.py as a module (scripts are not a package), registered under `name` so that its
    dataclasses can look their module up."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class NetListener:
    """A local TCP port that records every connection made to it: the W&B server and the HTTP(S) proxy of the
    run, so any attempt to go online is seen (and goes nowhere)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.seen: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    first = conn.recv(200).split(b"\r\n")[0].decode(errors="replace")
                except OSError:
                    first = "(nothing sent)"
                self.seen.append(first)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


# End-to-end scenarios whose parts other tests in CI cover, moved to `-m soak` to keep `.ci/run` under 30 minutes on
# two cores (the full suite took 41 min quietly, 2026-12-02). Each line: the nodeid prefix, and what still covers it.
SOAK = (
    "tests/test_train_e2e.py::test_train_through_vllm_cpu_generator",  # tests/test_vllm*.py: the engine itself
    "tests/test_train_e2e.py::test_interrupted_run_tears_down_everything[15]",  # [2] stays
    "tests/test_faults.py::test_one_host_elastic_run_gives_the_process_cluster_result",  # replicas_killed stays
    "tests/test_faults.py::test_verifier_replica_killed_is_retired_and_scores_do_not_change",  # test_service_faults
    "tests/test_faults.py::test_trainer_rank_killed_stops_cleanly_and_resume_finishes",  # test_run_integrity
    "tests/test_faults.py::test_two_runs_at_once_and_a_killed_controller_leaves_nothing",  # test_reaper
    "tests/test_env_verifier_pairs.py::test_every_pair_prepares_or_is_refused_before_spawning",  # one pair stays
    "tests/test_env_verifier_pairs.py::test_prepared_pairs_run_two_steps[sort-tiny]",
    "tests/test_sweep_summary.py::test_real_2x2_sweep_ends_with_its_answer",  # test_tracking_e2e's sweep
    "tests/test_train_multiturn.py::test_multi_turn_resume_after_kill_9_matches_an_uninterrupted_run",
    "tests/test_train_multiturn.py::test_guess_trains_with_exact_logprobs_across_turns_and_reproduces",
    "tests/test_run_integrity.py::test_resume_finished_run_then_fall_back_past_a_corrupt_checkpoint",
    "tests/test_transport_monarch.py::test_train_by_monarch_matches_shm_bit_for_bit[async-6]",
    "tests/test_reaper.py::test_kill_9_of_the_controller_at_any_moment_leaves_nothing[teardown-2-[rlexp] done:-0]",
    "tests/test_reaper.py::test_kill_9_of_the_controller_at_any_moment_leaves_nothing[mid-run-1000--2]",
    "tests/test_inprocess.py::test_overhead_bench_runs_the_same_steps_in_both",
    "tests/test_trainer_tp.py::test_rlexp_train_with_tensor_parallel_trainer_end_to_end",  # the TP unit tests stay
    "tests/test_trainer_parallel.py::test_rlexp_train_with_fsdp2_trainer_end_to_end",
)


TIERS = ("soak", "slurm", "e2e", "unit")


def tier(item: pytest.Item) -> str:
    """The one tier a test belongs to, the first that applies: `soak`, `slurm` (a real local
    Slurm), `e2e` (marked `slow`: spawns actors or runs `rlexp train`), else `unit`.
    `pytest -m <tier>` selects it; CI runs all but soak."""
    marks = {m.name for m in item.iter_markers()}
    return next((t for t in TIERS[:2] if t in marks), "e2e" if "slow" in marks else "unit")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid.startswith(SOAK):
            item.add_marker(pytest.mark.soak)
        name = tier(item)
        if name in ("e2e", "unit"):
            item.add_marker(getattr(pytest.mark, name))
        # In the junit XML, so that scripts/ci_durations.py sums the seconds per tier.
        item.user_properties.append(("tier", name))


_CPU_START = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    """User + system CPU of this process and of the children it has reaped (Monarch's meshes
    and every `rlexp` subprocess a test waits for). A Slurm job's processes are slurmd's: not
    counted."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_CPU_START] = _cpu_seconds()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test's CPU seconds (setup + call + teardown) in the junit XML beside its wall time, so
    scripts/ci_durations.py can tell a test that computes from one that waits."""
    outcome = yield
    if call.when == "teardown" and _CPU_START in item.stash:
        spent = _cpu_seconds() - item.stash[_CPU_START]
        outcome.get_result().user_properties.append(("cpu_s", f"{spent:.2f}"))


# --------------------------------------------- one two-process mesh for sharded trainers (issue 44)
@pytest.fixture(scope="session")
def two_procs() -> Any:
    """Two Monarch processes on this host, spawned once for tests/test_trainer_parallel.py
    (FSDP) and tests/test_trainer_tp.py (TP): a world-2 trainer joins the processes' one gloo
    group whichever layout it builds (`rlexp.models.parallel.init_parallel` reuses it), so the
    second module pays no start of its own. Each module shuts down the actors it spawned."""
    from monarch.actor import this_host

    two = this_host().spawn_procs(per_host={"procs": 2})
    yield two
    two.stop().get()
