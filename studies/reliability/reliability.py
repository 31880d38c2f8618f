"""Reliability table: faults, corruptions, bad inputs, secrets and concurrent runs, each tried through the CLI
as a hostile or unlucky user would, expected vs observed.

    python studies/reliability/reliability.py [--out studies/reliability/results/reliability.md] \\
        [--only SUBSTRING] [--keep DIR]

Every case runs real `rlexp` subprocesses (tiny model, a few steps) in a scratch folder. One short
finished run (`steps=6 checkpoint.every_n_steps=2`) is made once and copied for each case that needs
a run folder, so a case never sees another's leftovers. A case passes when the observed outcome
matches what README's "Untrusted run folders and manifests" promises: refused before anything spawns
with the cause named, nothing already written lost, no process left behind. Takes about 15 minutes
on a 2-core machine.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# checkpoints at steps 2 and 4
TINY = ["steps=6", "eval.every_n_steps=2", "checkpoint.every_n_steps=2"]


@dataclass
class Outcome:
    observed: str
    ok: bool
    seconds: float = 0.0


@dataclass
class Case:
    area: str
    what: str
    command: str
    expected: str
    run: Callable[[Path], Outcome]


def env_for(tag: str, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        RLEXP_TEST_TAG=tag,
        PYTHONUNBUFFERED="1",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
    )
    env.pop("WANDB_API_KEY", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update(extra)
    return env


def tagged_pids(tag: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            mine = f"RLEXP_TEST_TAG={tag}".encode() in (p / "environ").read_bytes().split(b"\0")
            # zombies are dead
            if mine and (p / "stat").read_text().split(") ")[-1].split()[0] != "Z":
                pids.append(int(p.name))
    return pids


def wait_clean(tag: str, timeout: float = 30.0) -> tuple[list[int], float]:
    t0 = time.time()
    while time.time() - t0 < timeout:
        left = tagged_pids(tag)
        if not left:
            return [], time.time() - t0
        time.sleep(0.25)
    return tagged_pids(tag), time.time() - t0


def rlexp(
    args: list[str], cwd: Path, timeout: float = 600, **env: str
) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "rlexp", *args],
        cwd=cwd,
        env=env_for(uuid.uuid4().hex, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, time.time() - t0


def last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return (lines[-1] if lines else "").strip()[:220]


def has_traceback(p: subprocess.CompletedProcess) -> bool:
    return "Traceback (most recent call last)" in p.stdout + p.stderr


class Base:
    """One finished tiny run, copied per case."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "base"
        p, _ = rlexp(["train", *TINY, f"hydra.run.dir={self.dir}"], cwd=root)
        if p.returncode != 0:
            raise SystemExit(f"base run failed:\n{p.stderr[-3000:]}")

    def copy(self, work: Path, name: str = "run") -> Path:
        dst = work / name
        shutil.copytree(self.dir, dst, symlinks=True)
        return dst


def refused(
    p: subprocess.CompletedProcess, secs: float, *needles: str, limit_s: float = 30.0
) -> Outcome:
    text = p.stdout + p.stderr
    named = all(n in text for n in needles)
    ok = p.returncode not in (0, None) and named and not has_traceback(p) and secs < limit_s
    return Outcome(
        f"exit {p.returncode} in {secs:.1f} s: {last_line(p.stderr) or last_line(p.stdout)}",
        ok,
        secs,
    )


CASES: list[Case] = []


def case(
    area: str, what: str, command: str, expected: str
) -> Callable[[Callable[[Path], Outcome]], Callable]:
    def deco(fn: Callable[[Path], Outcome]) -> Callable[[Path], Outcome]:
        CASES.append(Case(area, what, command, expected, fn))
        return fn
    return deco


# ------------------------------------------------------------------------------------------------
# cases
def start(args: list[str], cwd: Path, tag: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rlexp", *args],
        cwd=cwd,
        env=env_for(tag, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(proc: subprocess.Popen, needle: str, timeout: float = 300) -> str:
    """Reads the process's output until `needle` appears (or it exits); returns what was read."""
    seen: list[str] = []
    deadline = time.time() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if needle in line or time.time() > deadline:
            break
    return "".join(seen)


def hostile_manifest(work: Path, overrides: list[str], **hydra: str) -> Path:
    run = BASE.copy(work)
    m = json.loads((run / "manifest.json").read_text())
    m["overrides"] = list(m.get("overrides") or []) + overrides
    if hydra:
        m.setdefault("hydra", {}).update(hydra)
    (run / "manifest.json").write_text(json.dumps(m))
    return run


@case(
    "untrusted manifest",
    "`rlexp reproduce` of a manifest whose overrides add a Hydra callback writing a file",
    "rlexp reproduce RUN  # overrides += +hydra.callbacks.x._target_=pathlib.Path.write_text ...",
    "refused before anything runs, the override named, the file not written",
)
def _(work: Path) -> Outcome:
    target = work / "pwned.pth"
    run = hostile_manifest(
        work,
        [
            "+hydra.callbacks.x._target_=pathlib.Path.write_text",
            "+hydra.callbacks.x._args_=[{_target_:pathlib.Path,_args_:["
            + str(target)
            + "]},'import os']",
        ],
    )
    p, secs = rlexp(["reproduce", str(run)], cwd=work)
    out = refused(p, secs, "hydra.callbacks")
    out.ok = out.ok and not target.exists() and not (run.parent / "reproduce").exists()
    return out


@case(
    "untrusted manifest",
    "a manifest override with a resolver interpolation (`${oc.env:HOME}`)",
    "rlexp reproduce RUN  # overrides += logger.wandb.project=${oc.env:HOME}",
    "refused, the override named",
)
def _(work: Path) -> Outcome:
    run = hostile_manifest(work, ["logger.wandb.project=${oc.env:HOME}"])
    p, secs = rlexp(["reproduce", str(run)], cwd=work)
    return refused(p, secs, "oc.env")


@case("untrusted manifest", "a manifest naming its own config folder (`hydra.config_dir`)",
      "rlexp reproduce RUN  # manifest.hydra.config_dir = a folder with a hostile train.yaml",
      "the folder is not used: refused, or re-run from rlexp's own configs")
def _(work: Path) -> Outcome:
    evil = work / "evil_conf"
    evil.mkdir()
    (evil / "train.yaml").write_text("hydra:\n  callbacks:\n    x:\n      _target_: os.getcwd\n")
    run = hostile_manifest(work, [], config_dir=str(evil))
    p, secs = rlexp(["reproduce", "--dry-run", str(run)], cwd=work)
    used = str(evil) in p.stdout
    return Outcome(
        f"exit {p.returncode} in {secs:.1f} s; config folder in the command: {used}; "
        f"{last_line(p.stderr) or last_line(p.stdout)}",
        not used and not has_traceback(p),
        secs,
    )


@case(
    "bad input",
    "`trainer.lr=nan`",
    "rlexp train trainer.lr=nan",
    "refused before spawning, naming trainer.lr",
)
def _(work: Path) -> Outcome:
    p, secs = rlexp(["train", "trainer.lr=nan", f"hydra.run.dir={work / 'r'}"], cwd=work)
    return refused(p, secs, "trainer.lr")


@case(
    "bad input",
    "`trainer.lr=inf`",
    "rlexp train trainer.lr=inf",
    "refused before spawning, naming trainer.lr",
)
def _(work: Path) -> Outcome:
    p, secs = rlexp(["train", "trainer.lr=inf", f"hydra.run.dir={work / 'r'}"], cwd=work)
    return refused(p, secs, "trainer.lr")


@case("bad input", "a misspelt environment option", "rlexp train +environment.options.nterms=5",
      "refused before spawning, naming nterms and suggesting n_terms")
def _(work: Path) -> Outcome:
    p, secs = rlexp(
        ["train", "+environment.options.nterms=5", f"hydra.run.dir={work / 'r'}"], cwd=work
    )
    return refused(p, secs, "nterms", "n_terms")


@case(
    "bad input",
    "a `_target_` added on the command line, as a new key and inside free-form options",
    "rlexp train +trainer.x._target_=os.system; rlexp train "
    "+environment.options.x._target_=os.system",
    "both refused before spawning, the key named",
)
def _(work: Path) -> Outcome:
    outs = []
    for override, needle in (
        ("+trainer.x._target_=os.system", "trainer.x"),
        ("+environment.options.x._target_=os.system", "environment.options.x._target_"),
    ):
        p, secs = rlexp(["train", override, f"hydra.run.dir={work / 'r'}"], cwd=work)
        outs.append(refused(p, secs, needle))
    return Outcome(
        "; ".join(o.observed for o in outs), all(o.ok for o in outs), sum(o.seconds for o in outs)
    )


@case(
    "concurrent runs",
    "a second `rlexp train` on a live run folder",
    "rlexp train steps=60 hydra.run.dir=D & sleep 2; rlexp train hydra.run.dir=D",
    "the second refused at once naming the holder's pid and host; the first finishes, each step "
    "logged once",
)
def _(work: Path) -> Outcome:
    run, tag = work / "D", uuid.uuid4().hex
    first = start(["train", "steps=60", "eval.every_n_steps=0", f"hydra.run.dir={run}"], work, tag)
    try:
        time.sleep(2)
        p, secs = rlexp(["train", "steps=60", f"hydra.run.dir={run}"], cwd=work)
        first.wait(timeout=600)
    finally:
        first.kill()
    steps = [
        json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()
    ]
    once = len(steps) == len(set(steps)) and max(steps) >= 59
    out = refused(p, secs, "in use by pid", socket.gethostname(), limit_s=20)
    out.observed += (
        f"; first run exit {first.returncode}, {len(steps)} rows, each step once: {once}"
    )
    out.ok = out.ok and first.returncode == 0 and once
    return out


def flip(path: Path, at: int = 1024, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[at:at + n] = bytes(b ^ 0xFF for b in data[at:at + n])
    path.write_bytes(bytes(data))


def resume_outcome(work: Path, damage: Callable[[Path], None], needle: str) -> Outcome:
    run = BASE.copy(work)
    ckpts = sorted((run / "checkpoints").glob("step_*"))
    newest, older = ckpts[-1], ckpts[-2]
    damage(newest)
    p, secs = rlexp(["train", *TINY, "steps=8", "resume=auto", f"hydra.run.dir={run}"], cwd=work)
    said = f"resuming from {older.name}" in p.stdout + p.stderr and needle in p.stdout + p.stderr
    return Outcome(
        f"exit {p.returncode} in {secs:.0f} s; says it skips {newest.name} and resumes from "
        f"{older.name}: {said}",
        p.returncode == 0 and said and not has_traceback(p),
        secs,
    )


@case(
    "corruption",
    "64 bytes flipped in the newest checkpoint's `trainer.pt`, then `resume=auto`",
    "rlexp train resume=auto hydra.run.dir=RUN",
    "falls back to the newest intact checkpoint, saying which and why",
)
def _(work: Path) -> Outcome:
    return resume_outcome(work, lambda c: flip(c / "trainer.pt"), "sha256")


@case(
    "corruption",
    "the newest checkpoint's `meta.json` is not JSON, then `resume=auto`",
    "rlexp train resume=auto hydra.run.dir=RUN",
    "falls back to the newest intact checkpoint, naming the file",
)
def _(work: Path) -> Outcome:
    return resume_outcome(work, lambda c: (c / "meta.json").write_text("{not json"), "meta.json")


@case(
    "corruption",
    "`controller.pt` replaced by a crafted pickle that calls `os.system`",
    "rlexp train resume=auto hydra.run.dir=RUN",
    "never unpickled: refused or skipped, naming what it references",
)
def _(work: Path) -> Outcome:
    import pickle

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {work / 'pwned'}",))

    def damage(c: Path) -> None:
        (c / "controller.pt").write_bytes(pickle.dumps(Evil()))

    out = resume_outcome(work, damage, "controller.pt")
    out.ok = out.ok and not (work / "pwned").exists()
    return out


@case(
    "corruption",
    "`metrics.jsonl` cut mid-line by a crash, then compared",
    "python -c 'from rlexp.tracking.reproduce import compare_metrics; print(compare_metrics(A, "
    "B))'",
    "the partial last line skipped with a warning naming file and line; no crash",
)
def _(work: Path) -> Outcome:
    a, b = BASE.copy(work, "a"), BASE.copy(work, "b")
    with open(b / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "loss": 0.1')
    code = (
        "from rlexp.tracking.reproduce import compare_metrics; "
        f"print(compare_metrics('{a}/metrics.jsonl', '{b}/metrics.jsonl'))"
    )
    t0 = time.time()
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=120
    )
    warned = "partial last line" in p.stderr and "metrics.jsonl" in p.stderr
    ok = p.returncode == 0 and warned and p.stdout.strip() == "None"
    return Outcome(
        f"exit {p.returncode}; compare_metrics -> {p.stdout.strip()}; warned: {warned}",
        ok,
        time.time() - t0,
    )


@case(
    "run folders",
    "`resume=auto` on a run that already finished",
    "rlexp train resume=auto hydra.run.dir=RUN",
    "says it is complete, exit 0, checkpoints and metrics untouched",
)
def _(work: Path) -> Outcome:
    run = BASE.copy(work)
    before = {q: q.read_bytes() for q in run.rglob("*") if q.is_file() and ".hydra" not in q.parts}
    p, secs = rlexp(["train", *TINY, "resume=auto", f"hydra.run.dir={run}"], cwd=work)
    same = all(q.read_bytes() == b for q, b in before.items() if q.name != ".lock")
    ok = p.returncode == 0 and "already complete" in p.stdout + p.stderr and same and secs < 60
    return Outcome(
        f"exit {p.returncode} in {secs:.1f} s: {last_line(p.stdout)}; files unchanged: {same}",
        ok,
        secs,
    )


@case("run folders", "the disk fills up during a run (a 2 MB tmpfs as the run folder)",
      "mount -t tmpfs -o size=2m tmpfs D && rlexp train hydra.run.dir=D",
      "one line naming ENOSPC, manifest status failed with the reason, no temporary files left")
def _(work: Path) -> Outcome:
    mnt = work / "small"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        return Outcome("skipped: cannot mount a tmpfs here (needs root)", True)
    try:
        p, secs = rlexp(["train", *TINY, f"hydra.run.dir={mnt / 'run'}"], cwd=work)
        m = json.loads((mnt / "run" / "manifest.json").read_text())
        tmp = [q.name for q in (mnt / "run").rglob("*tmp*")]
        ok = (
            p.returncode != 0
            and "ENOSPC" in p.stderr
            and m.get("status") == "failed"
            and not tmp
            and not has_traceback(p)
        )
        return Outcome(
            f"exit {p.returncode}: {last_line(p.stderr)}; manifest {m.get('status')}; "
            f"temporaries {tmp}",
            ok,
            secs,
        )
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def socket_dirs() -> set[str]:
    return {q.name for q in Path(tempfile.gettempdir()).glob("monarch_process_job_*")}


def kill_at(work: Path, needle: str, sig: int = signal.SIGKILL, twice: bool = False) -> Outcome:
    tag, before = uuid.uuid4().hex, socket_dirs()
    proc = start(
        [
            "train",
            "cluster=process",
            "steps=200",
            "eval.every_n_steps=0",
            f"hydra.run.dir={work / 'r'}",
        ],
        work,
        tag,
    )
    seen = wait_for(proc, needle)
    proc.send_signal(sig)
    if twice:
        time.sleep(0.5)
        proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=120)
    left, secs = wait_clean(tag, timeout=30)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    new_dirs = socket_dirs() - before
    tb = "Traceback (most recent call last)" in seen + rest
    ok = not left and not new_dirs and (sig == signal.SIGKILL or not tb)
    return Outcome(
        f"exit {proc.returncode}; processes left after {secs:.1f} s: {len(left)}; socket "
        f"folders left: {len(new_dirs)}; traceback: {tb}",
        ok,
        secs,
    )


@case("faults", "controller SIGKILLed while hosts start (`cluster=process`)",
      "rlexp train cluster=process & kill -9 $! once 'hosts up' is printed",
      "every host process gone within 30 s, no socket folder left")
def _(work: Path) -> Outcome:
    return kill_at(work, "hosts up")


@case("faults", "controller SIGKILLed mid-run (`cluster=process`)",
      "rlexp train cluster=process & kill -9 $! at step 10",
      "every host process gone within 30 s, no socket folder left")
def _(work: Path) -> Outcome:
    return kill_at(work, "step 10")


@case(
    "faults",
    "Ctrl-C twice during start-up (`cluster=process`)",
    "rlexp train cluster=process, then ^C ^C",
    "one line, no traceback, no process or socket folder left",
)
def _(work: Path) -> Outcome:
    return kill_at(work, "hosts up", signal.SIGINT, twice=True)


class Listener:
    """A loopback port that counts connections: the W&B server and every proxy of a run point
    here."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port, self.count, self.stop = self.sock.getsockname()[1], 0, threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                self.sock.accept()[0].close()
                self.count += 1


@case(
    "trackers",
    "`WANDB_MODE=offline` with `WANDB_API_KEY` set",
    "WANDB_MODE=offline WANDB_API_KEY=... rlexp train logger=wandb",
    "offline run folder, no connection attempted",
)
def _(work: Path) -> Outcome:
    net = Listener()
    url = f"http://127.0.0.1:{net.port}"
    p, secs = rlexp(
        ["train", "steps=2", "eval.every_n_steps=0", "logger=wandb", f"hydra.run.dir={work / 'r'}"],
        cwd=work,
        WANDB_API_KEY="x" * 40,
        WANDB_BASE_URL=url,
        HTTPS_PROXY=url,
        HTTP_PROXY=url,
        WANDB_DIR=str(work),
    )
    net.stop.set()
    offline = any((work / "r").rglob("offline-run-*"))
    return Outcome(f"exit {p.returncode}; offline run folder: {offline}; connections: {net.count}",
                   p.returncode == 0 and offline and net.count == 0, secs)


SECRETS = {
    "pwd": "Pw-{n}",
    "pass": "Pa-{n}",
    "db_pass": "Db-{n}",
    "dsn": "postgres://u:Ds-{n}@h/db",
    "connection_string": "Server=h;Password=Cs-{n}",
    "webhook_url": "https://hooks.slack.com/services/T0/B0/Wh{n}",
    "smtp_pwd": "Sm-{n}",
    "api_key": "Ak-{n}",
    "note": "password=Nt-{n}",
}


def planted_secrets(work: Path, secrets: dict[str, str]) -> Outcome:
    """A run under `logger=all` with each secret planted as `+extra.NAME` (a marker in its value):
    no file of the run folder, the W&B files or the MLflow store may hold the marker."""
    marker = uuid.uuid4().hex[:10]
    # quoted: Hydra splits on = ; ,
    over = [f"+extra.{k}='{v.format(n=marker)}'" for k, v in secrets.items()]
    p, secs = rlexp(
        [
            "train",
            "steps=2",
            "eval.every_n_steps=0",
            "logger=all",
            *over,
            f"hydra.run.dir={work / 'r'}",
            f"logger.runs_root={work}",
        ],
        cwd=work,
    )
    leaks = sorted({str(q.relative_to(work)) for q in work.rglob("*")
                    if q.is_file() and marker.encode() in q.read_bytes()})
    db = next(work.rglob("mlflow.db"), None)
    if db is not None:
        with sqlite3.connect(db) as con:
            for (t,) in con.execute("select name from sqlite_master where type='table'").fetchall():
                if marker in repr(con.execute(f"select * from {t}").fetchall()):
                    leaks.append(f"mlflow.db:{t}")
    return Outcome(f"exit {p.returncode}; files with a secret: {leaks or 'none'}",
                   p.returncode == 0 and not leaks and db is not None, secs)


@case(
    "secrets",
    f"{len(SECRETS)} planted secrets (`+extra.pwd`, `pass`, `db_pass`, `dsn`, `connection_string`, "
    "`webhook_url`, ...) through `logger=all`",
    "rlexp train logger=all +extra.pwd=... +extra.dsn=... ...",
    "no secret in any file of the run folder, the W&B files or the MLflow store",
)
def _(work: Path) -> Outcome:
    return planted_secrets(work, SECRETS)


@case("secrets", "a secret under a key that is not in the schema (`+x.pwd`): the run is refused",
      "rlexp train +x.pwd=...", "refused naming the key; Hydra's `.hydra/` copies already redacted")
def _(work: Path) -> Outcome:
    secret = f"Pw-{uuid.uuid4().hex[:10]}"
    p, secs = rlexp(["train", f"+x.pwd={secret}", f"hydra.run.dir={work / 'r'}"], cwd=work)
    out = refused(p, secs, "x: not a key")
    leaks = [
        str(q.relative_to(work))
        for q in work.rglob("*")
        if q.is_file() and secret.encode() in q.read_bytes()
    ]
    out.observed += f"; files with the secret: {leaks or 'none'}"
    out.ok = out.ok and not leaks
    return out


@case("trackers", "`MLFLOW_TRACKING_URI=sqlite:///...` run from another folder",
      "cd elsewhere && MLFLOW_TRACKING_URI=sqlite:///S/mlflow.db rlexp train logger=mlflow",
      "artifacts beside the store, nothing written to the current folder")
def _(work: Path) -> Outcome:
    store, cwd = work / "store", work / "cwd"
    store.mkdir()
    cwd.mkdir()
    p, secs = rlexp(
        [
            "train",
            "steps=2",
            "eval.every_n_steps=0",
            "logger=mlflow",
            f"hydra.run.dir={work / 'r'}",
        ],
        cwd=cwd,
        MLFLOW_TRACKING_URI=f"sqlite:///{store}/mlflow.db",
    )
    in_cwd = sorted(q.name for q in cwd.iterdir())
    beside = any((store / "artifacts").rglob("manifest.json"))
    return Outcome(
        f"exit {p.returncode}; in the current folder: {in_cwd or 'nothing'}; artifacts beside "
        f"the store: {beside}",
        p.returncode == 0 and not in_cwd and beside,
        secs,
    )


# --- issue 41: links and run-folder safety ---
def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(q.relative_to(folder)): (q.read_bytes(), q.stat().st_mtime_ns)
            for q in sorted(folder.rglob("*")) if q.is_file()}


def one_error(
    p: subprocess.CompletedProcess, secs: float, needle: str, limit_s: float = 60.0
) -> Outcome:
    """Refused with exactly one `rlexp: error:` line holding `needle`, no traceback."""
    errors = [x for x in p.stderr.splitlines() if x.startswith("rlexp: error:")]
    out = refused(p, secs, needle, limit_s=limit_s)
    out.ok = out.ok and p.returncode == 2 and len(errors) == 1 and needle in errors[0]
    return out


@case(
    "run folders",
    "`.lock`, `train.log` and `eval_samples` are links outside the run folder, beside a linked "
    "`secret.txt`",
    "rlexp train resume=auto logger=mlflow hydra.run.dir=RUN",
    "refused before anything is written, naming each link; the outside files untouched, nothing "
    "uploaded",
)
def _(work: Path) -> Outcome:
    run, out = BASE.copy(work), work / "outside"
    (out / "samples").mkdir(parents=True)
    secret = f"S3CRET-{uuid.uuid4().hex}"
    for name, text in (
        ("secret.txt", secret),
        ("samples/secret.txt", secret),
        ("lock", "lock"),
        ("log", "log"),
    ):
        (out / name).write_text(text + "\n")
    for name in (".lock", "train.log", "eval_samples"):
        shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    (run / ".lock").symlink_to(out / "lock")
    (run / "train.log").symlink_to(out / "log")
    (run / "eval_samples").symlink_to(out / "samples", target_is_directory=True)
    (run / "secret.txt").symlink_to(out / "secret.txt")
    before = snapshot(out)
    p, secs = rlexp(
        [
            "train",
            *TINY,
            "steps=8",
            "resume=auto",
            "logger=mlflow",
            f"logger.mlflow.tracking_uri=sqlite:///{work}/store/mlflow.db",
            f"hydra.run.dir={run}",
        ],
        cwd=work,
    )
    res = one_error(p, secs, "is a link to")
    named = all(
        f"{run / n} is a link to" in p.stderr
        for n in (".lock", "train.log", "eval_samples", "secret.txt")
    )
    same = snapshot(out) == before
    leaks = [str(q.relative_to(work)) for q in work.rglob("*") if q.is_file() and not q.is_symlink()
             and out not in q.parents and secret.encode() in q.read_bytes()]
    res.observed += (
        f"; each link named: {named}; outside files unchanged: {same}; copies of the secret: "
        f"{leaks or 'none'}"
    )
    res.ok = res.ok and named and same and not leaks
    return res


@case("run folders", "the run folder's `.lock` is a folder",
      "mkdir RUN/.lock; rlexp train resume=auto hydra.run.dir=RUN",
      "one message naming the lock and the fix (remove it), before anything loads")
def _(work: Path) -> Outcome:
    run = BASE.copy(work)
    (run / ".lock").unlink()
    (run / ".lock").mkdir()
    p, secs = rlexp(["train", *TINY, "steps=8", "resume=auto", f"hydra.run.dir={run}"], cwd=work)
    return one_error(p, secs, "is a folder; it must be a regular file", limit_s=30)


@case(
    "run folders",
    "a read-only run folder (`chmod -R a-w`; as root, run without CAP_DAC_OVERRIDE)",
    "chmod -R a-w RUN; rlexp train resume=auto hydra.run.dir=RUN",
    "one message naming what cannot be written and the fix (chmod -R u+w), before anything loads",
)
def _(work: Path) -> Outcome:
    run = BASE.copy(work)
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return Outcome("skipped: root without setpriv, permission bits cannot bind the run", True)
    subprocess.run(["chmod", "-R", "a-w", str(run)], check=True)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    t0 = time.time()
    try:
        p = subprocess.run(
            [
                *drop,
                sys.executable,
                "-m",
                "rlexp",
                "train",
                *TINY,
                "steps=8",
                "resume=auto",
                f"hydra.run.dir={run}",
            ],
            cwd=work,
            env=env_for(uuid.uuid4().hex),
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(run)], check=True)
    out = one_error(p, time.time() - t0, "cannot be written", limit_s=30)
    out.ok = out.ok and "chmod -R u+w" in p.stderr
    return out


@case(
    "bad input",
    "`logger.wandb.project=../..`",
    "rlexp train logger=wandb logger.wandb.project=../..",
    "refused before spawning, naming the key and a valid name",
)
def _(work: Path) -> Outcome:
    p, secs = rlexp(
        [
            "train",
            *TINY,
            "logger=wandb",
            "logger.wandb.project=../..",
            f"hydra.run.dir={work / 'r'}",
        ],
        cwd=work,
    )
    return one_error(p, secs, "logger.wandb.project='../..' is not a W&B name")


@case("bad input", "`checkpoint.keep=0` (would delete every periodic checkpoint)",
      "rlexp train checkpoint.every_n_steps=2 checkpoint.keep=0",
      "refused before spawning, naming the key and the fix (keep=1, or every_n_steps=0)")
def _(work: Path) -> Outcome:
    p, secs = rlexp(["train", *TINY, "checkpoint.keep=0", f"hydra.run.dir={work / 'r'}"], cwd=work)
    return one_error(p, secs, "checkpoint.keep=0 would delete every periodic checkpoint")
# --- issue 41: resume and SIGTERM ---
def metric_steps(run: Path) -> list[int]:
    return [
        json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()
    ]


def interrupted_copy(work: Path, at: int) -> Path:
    """A copy of the base run as if stopped after step `at` before any checkpoint: no checkpoint,
    rows to `at`, manifest status interrupted."""
    run = BASE.copy(work)
    shutil.rmtree(run / "checkpoints")
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(
        "".join(x + "\n" for x in rows if json.loads(x)["step"] <= at)
    )
    m = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**m, "status": "interrupted"}))
    return run


@case(
    "resume",
    "`resume=auto` on an interrupted run that wrote no checkpoint (`checkpoint.every_n_steps=0`)",
    "rlexp train resume=auto hydra.run.dir=RUN  # RUN: stopped at step 4, no checkpoint",
    "refused naming resume=restart, metrics.jsonl untouched (no silent restart at step 0)",
)
def _(work: Path) -> Outcome:
    run = interrupted_copy(work, 4)
    before = (run / "metrics.jsonl").read_bytes()
    p, secs = rlexp(["train", *TINY, "resume=auto", f"hydra.run.dir={run}"], cwd=work)
    out = refused(p, secs, "no checkpoint to continue from", "resume=restart", limit_s=60)
    same = (run / "metrics.jsonl").read_bytes() == before
    out.observed += f"; metrics.jsonl unchanged: {same}"
    out.ok = out.ok and same
    return out


@case(
    "resume",
    "`resume=auto steps=3` when the newest checkpoint is step 4",
    "rlexp train resume=auto steps=3 hydra.run.dir=RUN",
    "refused naming both numbers, nothing written",
)
def _(work: Path) -> Outcome:
    run = BASE.copy(work)
    before = (run / "metrics.jsonl").read_bytes()
    p, secs = rlexp(["train", *TINY, "steps=3", "resume=auto", f"hydra.run.dir={run}"], cwd=work)
    out = refused(
        p, secs, "steps=3 is below the step of the checkpoint being resumed, 4", limit_s=60
    )
    out.ok = out.ok and (run / "metrics.jsonl").read_bytes() == before
    return out


@case(
    "resume",
    "SIGTERM at step 3 of a `cluster=process` run (checkpoints every 2), then `resume=auto`",
    "rlexp train cluster=process hydra.run.dir=D & kill -TERM $! at step 3; rlexp train ... "
    "resume=auto",
    "checkpoint of the step written, manifest interrupted with the signal and resume command, "
    "exit 143 in < 60 s, nothing left running; resumed metrics identical to an uninterrupted "
    "run, each step once",
)
def _(work: Path) -> Outcome:
    tag, run = uuid.uuid4().hex, work / "r"
    args = ["train", *TINY, "cluster=process", f"hydra.run.dir={run}"]
    proc = start(args, work, tag)
    while not ((run / "metrics.jsonl").exists() and max(metric_steps(run), default=-1) >= 3):
        if proc.poll() is not None:
            return Outcome(f"exited {proc.returncode} before step 3", False)
        time.sleep(0.05)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    secs = time.time() - t0
    left, _ = wait_clean(tag)
    stop = json.loads((run / "manifest.json").read_text())
    mark = stop.get("interrupted") or {}
    ckpt = run / "checkpoints" / f"step_{mark.get('step', -1):06d}" / "COMPLETE"
    stopped = (
        proc.returncode == 143
        and secs < 60
        and not left
        and stop["status"] == "interrupted"
        and mark.get("signal") == "SIGTERM"
        and ckpt.is_file()
        and "resume=auto" in mark.get("resume", "")
    )
    p, more = rlexp([*args, "resume=auto"], cwd=work)
    code = ("from rlexp.tracking.reproduce import compare_metrics as c; "
            f"print(c('{BASE.dir}/metrics.jsonl', '{run}/metrics.jsonl'))")
    same = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    once = metric_steps(run) == list(range(7))
    return Outcome(
        f"exit {proc.returncode} in {secs:.1f} s, checkpoint at step {mark.get('step')}, "
        f"manifest {stop['status']} ({mark.get('signal')}), left running {left}; resume "
        f"exit {p.returncode} in {more:.0f} s, compare_metrics -> {same}, each step once: {once}",
        stopped and p.returncode == 0 and same == "None" and once,
        secs + more,
    )
# --- issue 41: trust boundary ---
EVIL_MODULE = "open({sentinel!r}, 'a').write('imported\\n')\nclass Env: pass\n"


def planted(run: Path, work: Path, name: str) -> Path:
    """A module planted in the run folder that leaves a file when imported: the evidence code
    ran."""
    sentinel = work / f"{name}.ran"
    (run / f"{name}.py").write_text(EVIL_MODULE.format(sentinel=str(sentinel)))
    return sentinel


@case(
    "untrusted manifest",
    "a mailed run folder whose recorded `config.environment.name` is `evilmod:Env`, with "
    "`evilmod.py` in the folder, scored from inside it",
    "cd RUN && rlexp eval run=.  # manifest config.environment.name = evilmod:Env, RUN/evilmod.py",
    "refused naming environment.name and --trust-plugins; nothing imported",
)
def _(work: Path) -> Outcome:
    run = BASE.copy(work)
    sentinel = planted(run, work, "evilmod")
    m = json.loads((run / "manifest.json").read_text())
    m["config"]["environment"]["name"] = "evilmod:Env"
    m["hydra"]["runtime_cwd"] = None
    (run / "manifest.json").write_text(json.dumps(m))
    p, secs = rlexp(["eval", "run=.", "--out", str(work / "out")], cwd=run)
    out = refused(p, secs, "environment.name", "--trust-plugins")
    out.ok = out.ok and not sentinel.exists()
    return out


@case(
    "untrusted manifest",
    "a mailed manifest's override with a quoted class path, `environment.name='evilmod2:Env'`",
    "rlexp reproduce RUN  # overrides += environment.name='evilmod2:Env', RUN/evilmod2.py",
    "refused as Hydra parses it (quotes removed), naming the key; nothing imported",
)
def _(work: Path) -> Outcome:
    run = BASE.copy(work)
    sentinel = planted(run, work, "evilmod2")
    m = json.loads((run / "manifest.json").read_text())
    m["overrides"] = [*m["overrides"], "environment.name='evilmod2:Env'"]
    (run / "manifest.json").write_text(json.dumps(m))
    p, secs = rlexp(["reproduce", str(run)], cwd=run)
    out = refused(p, secs, "environment.name", "--trust-plugins")
    out.ok = out.ok and not sentinel.exists() and not (run.parent / "reproduce").exists()
    return out


@case(
    "untrusted manifest",
    "a mailed manifest's `logger.mlflow.tracking_uri=http://127.0.0.1:PORT` with "
    "`MLFLOW_TRACKING_TOKEN` set (a loopback listener on PORT)",
    "MLFLOW_TRACKING_TOKEN=... rlexp reproduce RUN  # overrides += logger=mlflow "
    "logger.mlflow.tracking_uri=...",
    "refused naming the key (an endpoint: pass it yourself); no connection, the token goes nowhere",
)
def _(work: Path) -> Outcome:
    seen: list[bytes] = []
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = srv.accept()
                with conn:
                    seen.append(conn.recv(4096))
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    run = hostile_manifest(work, ["logger=mlflow", f"logger.mlflow.tracking_uri=http://127.0.0.1:"
                                                   f"{srv.getsockname()[1]}"])
    p, secs = rlexp(["reproduce", str(run)], cwd=work, MLFLOW_TRACKING_TOKEN="tok-issue41")
    stop.set()
    thread.join(timeout=5)
    srv.close()
    out = refused(p, secs, "logger.mlflow.tracking_uri")
    out.observed += f"; connections to the listener: {len(seen)}"
    out.ok = out.ok and not seen
    return out


@case(
    "untrusted manifest",
    "a mailed manifest's `cluster.shm_dir=/some/folder` naming a folder of yours",
    "rlexp reproduce RUN  # overrides += cluster.shm_dir=DIR (DIR holds your files)",
    "refused naming the key (a place: pass it yourself); DIR untouched",
)
def _(work: Path) -> Outcome:
    victim = work / "mine"
    (victim / "photos-3999999").mkdir(parents=True)
    (victim / "photos-3999999" / "a.jpg").write_text("x")
    (victim / "notes.txt").write_text("mine")
    run = hostile_manifest(work, [f"cluster.shm_dir={victim}"])
    p, secs = rlexp(["reproduce", str(run)], cwd=work)
    out = refused(p, secs, "cluster.shm_dir")
    intact = (victim / "notes.txt").is_file() and (victim / "photos-3999999" / "a.jpg").is_file()
    out.observed += f"; {victim.name}/ intact: {intact}"
    out.ok = out.ok and intact
    return out


@case(
    "untrusted manifest",
    "weights cleanup in a `cluster.shm_dir` you chose that holds other folders "
    "(`photos-3999999`: a name ending in a pid no process has)",
    "rlexp train steps=2 cluster.shm_dir=DIR  # DIR/photos-3999999/a.jpg, DIR/notes.txt",
    "only folders rlexp's shm transport made (its marker file) are deleted; DIR's other "
    "contents kept",
)
def _(work: Path) -> Outcome:
    shm = work / "shm"
    (shm / "photos-3999999").mkdir(parents=True)
    (shm / "photos-3999999" / "a.jpg").write_text("x")
    (shm / "notes.txt").write_text("mine")
    p, secs = rlexp(
        [
            "train",
            "steps=2",
            "eval.every_n_steps=0",
            "cluster.transport=shm",
            f"cluster.shm_dir={shm}",
            f"hydra.run.dir={work / 'r'}",
        ],
        cwd=work,
    )
    kept = sorted(str(q.relative_to(shm)) for q in shm.rglob("*"))
    ok = p.returncode == 0 and kept == ["notes.txt", "photos-3999999", "photos-3999999/a.jpg"]
    return Outcome(f"exit {p.returncode} in {secs:.1f} s; left in DIR: {kept}", ok, secs)
# --- issue 41: compare, redaction, host sizes ---
DAMAGE = {  # appended to a run's metrics.jsonl: line content -> what the warning must say
    '{"step": 7, "reward/mean": Infinity}': "not finite; value dropped",
    '{"step": "two", "reward/mean": 0.5}': 'step "two" is not a whole number',
    "[1, 2]": "a JSON list, not an object",
    "[" * 50_000 + "]" * 50_000: "levels deep, over the limit",
    '{"step": 8, "x\udcff": 1}': "not UTF-8",
    '{"step": 9, "pad": "' + "x" * (2 << 20) + '"}': "over the limit of 1048576",
}
FORMULAS = ['=HYPERLINK("http://evil.invalid","x")', "@SUM(1+1)", "+1+1", "\uff1d1+1"]


@case(
    "bad input",
    "`rlexp compare` on a hostile sweep: formula run names and `extra` values, `<script>` and a "
    "newline heading, Infinity, `\"step\": \"two\"`, a list, deep nesting, non-UTF-8, a 2 MiB "
    "line, duplicate steps (#41)",
    "rlexp compare SWEEP --out OUT",
    "exit 0; one warning per damaged line naming file:line; duplicate steps named, later rows "
    "used; no live formula in runs.csv/compare.csv; compare.md escaped",
)
def _(work: Path) -> Outcome:
    sweep = work / "sweep"
    for i, name in enumerate(FORMULAS):
        run = BASE.copy(sweep, str(i))
        m = json.loads((run / "manifest.json").read_text())
        m["identity"]["run_name"] = name
        m["config"].setdefault("extra", {})["note"] = [
            "<script>alert(1)</script>",
            "a\n# Heading",
            "-0.5",
            name,
        ][i]
        (run / "manifest.json").write_text(json.dumps(m))
    lines = (sweep / "0" / "metrics.jsonl").read_text().splitlines()
    with open(sweep / "1" / "metrics.jsonl", "ab") as f:
        for text in DAMAGE:
            f.write(text.encode("utf-8", "surrogateescape") + b"\n")
    with open(sweep / "2" / "metrics.jsonl", "a") as f:
        f.write("\n".join(lines[:3]) + "\n")  # steps logged again: a resume that did not truncate
    p, secs = rlexp(["compare", str(sweep), "--out", str(work / "out")], cwd=work)
    first = len(lines) + 1
    named = [
        f"metrics.jsonl:{first + k}: " in p.stderr and want in p.stderr
        for k, want in enumerate(DAMAGE.values())
    ]
    dup = "logged more than once" in p.stderr and "later rows are used" in p.stderr
    cells = []
    for name in ("runs.csv", "compare.csv"):
        with contextlib.suppress(OSError), open(work / "out" / name, encoding="utf-8") as f:
            cells += [c for row in csv.reader(f) for c in row]
    live = [c for c in cells if c.lstrip().startswith(("=", "+", "@", "\uff1d")) or
            (c.startswith("-") and not re.fullmatch(r"-[\d.]+(?:e[+-]?\d+)?", c))]
    md = (
        (work / "out" / "compare.md").read_text(encoding="utf-8")
        if (work / "out" / "compare.md").exists()
        else ""
    )
    inert = (
        "<script" not in md
        and not any(x.startswith("#") for x in md.splitlines())
        and "&lt;script" in md
    )
    ok = (
        p.returncode == 0
        and all(named)
        and dup
        and not live
        and inert
        and not has_traceback(p)
        and bool(cells)
    )
    return Outcome(
        f"exit {p.returncode} in {secs:.1f} s; damaged lines named {sum(named)}/{len(named)}; "
        f"duplicate steps named: {dup}; live formula cells: {len(live)}; compare.md "
        f"inert: {inert}",
        ok,
        secs,
    )


SECRETS_41 = {"pat": "Pt-{n}", "otp": "Ot-{n}", "sas_sig": "Sg-{n}", "totp_secret": "Tt-{n}",
              "note": "https://a.blob.core.windows.net/c/b?sv=2022-11-02&se=2026-01-01&sig=Sx{n}"}


@case(
    "secrets",
    "planted `+extra.pat`, `+extra.otp`, `+extra.sas_sig`, `+extra.totp_secret` and an Azure "
    "SAS URL through `logger=all` (#41)",
    "rlexp train logger=all +extra.pat=... +extra.otp=... +extra.sas_sig=... ...",
    "no secret in any file of the run folder, the W&B files or the MLflow store",
)
def _(work: Path) -> Outcome:
    return planted_secrets(work, SECRETS_41)


for _over, _needle in (
    (["algorithm.group_size=1000000"], "algorithm.group_size=1000000 -> at most"),
    (["algorithm.prompts_per_step=100000000"], "algorithm.prompts_per_step=100000000 -> at most"),
    (["algorithm.prompts_per_step=1e8"], "algorithm.prompts_per_step"),
    (["algorithm.max_tokens=100000000"], "model.arch.max_seq_len=1024"),
    (["generator.replicas=64", "cluster=process"], "generator.replicas=64 -> at most"),
):

    def _size_case(work: Path, over: list[str] = _over, needle: str = _needle) -> Outcome:
        p, secs = rlexp(["train", *over, f"hydra.run.dir={work / 'r'}"], cwd=work, timeout=120)
        return refused(p, secs, needle, limit_s=10.0)

    case(
        "bad input",
        f"a size this machine cannot hold: `{' '.join(_over)}` (#41)",
        f"rlexp train {' '.join(_over)}",
        "refused in under 10 s, before torch loads or anything spawns, naming the key and the "
        "value that fits (or the context)",
    )(_size_case)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "reliability.md"
    )
    ap.add_argument("--only", default="", help="run only cases whose description contains this")
    ap.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="scratch folder to keep (default: a temp folder, removed)",
    )
    args = ap.parse_args(argv)
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="rlexp-reliability-"))
    scratch.mkdir(parents=True, exist_ok=True)
    global BASE
    BASE = Base(scratch)
    rows = []
    for i, c in enumerate(CASES):
        if args.only and args.only not in c.what:
            continue
        work = scratch / f"case{i:02d}"
        work.mkdir(exist_ok=True)
        try:
            out = c.run(work)
        except Exception as e:  # a case that breaks is a failed case, reported, not a crashed table
            out = Outcome(f"case raised {type(e).__name__}: {e}"[:220], False)
        print(f"[{'ok' if out.ok else 'FAIL'}] {c.area}: {c.what} -> {out.observed}", flush=True)
        rows.append((c, out))
    write_table(args.out, rows, argv if argv is not None else sys.argv[1:])
    if args.keep is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if all(o.ok for _, o in rows) else 1


def write_table(out: Path, rows: list[tuple[Case, Outcome]], argv: list[str]) -> None:
    passed = sum(o.ok for _, o in rows)
    lines = [
        "# Reliability: faults, corruptions, bad inputs, secrets, concurrent runs",
        "",
        "Reproduce: `python "
        f"studies/reliability/reliability.py{' ' + ' '.join(argv) if argv else ''}` (2-core CPU "
        "machine, tiny Qwen3 policy; each case is a real `rlexp` subprocess in a scratch "
        "folder).",
        "",
        f"{passed} of {len(rows)} cases behave as promised. Commands are shown as a user would "
        "type them; `RUN` is a",
        "copy of one finished `rlexp train steps=6 eval.every_n_steps=2 "
        "checkpoint.every_n_steps=2` run.",
        "",
        "| area | case | command | expected | observed | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c, o in rows:
        obs = o.observed.replace("|", "\\|").replace("\n", " ")
        verdict = "as expected" if o.ok else "NOT as expected"
        lines.append(f"| {c.area} | {c.what} | `{c.command}` | {c.expected} | {obs} | {verdict} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {passed}/{len(rows)} as expected")


BASE: Base


if __name__ == "__main__":
    sys.exit(main())
