"""A hostile run folder, fuzzed: seeded mutations of a real finished run's manifest and files (keys, values, quoting,
escapes, interpolations, `_target_`, class paths, URLs, paths, symlinks, sizes) go through `rlexp reproduce`,
`rlexp eval run=` and `rlexp compare`, each in a child process that stands in the run folder (the worst working
folder: a module planted there is one `sys.path` entry away) with an audit hook (`sys.addaudithook`, installed by
`BOOT` before rlexp is imported) that records

- code loaded from a file outside the module path this process started with (rlexp, the standard library,
  site-packages): a planted module imported,
- a file opened for writing, removed, renamed or a tree deleted outside the run folder and the case's own
  temporary folders,
- any socket connection.

Every case must complete (exit 0) or be refused (exit 2, a message, no traceback), with none of those events.
A `rlexp reproduce` that passes the gate is followed, in the same audited process, by what the re-run would do
before it spawns anything (`rlexp.run.prepare.prepare` of the printed command's config), so a value that slips
through the gate and names code is caught importing it, not just printed. The four findings of issue 41 are fixed
cases. Bounded: one real 2-step training run per session (shared); each case one short child
(about a second).
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, CheckpointedRun, NetListener

pytestmark = pytest.mark.slow  # one real `rlexp train` (Monarch actors) builds the folder every case mutates

# The child: audit hook first, then rlexp. RLEXP_AUDIT_* say where to log and which folders may be written.
BOOT = r"""
import json, os, sys
_fd = os.open(os.environ["RLEXP_AUDIT_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
_real = os.path.realpath
_write_ok = [_real(p) for p in json.loads(os.environ["RLEXP_AUDIT_WRITE_OK"])]
_code_ok = [_real(p) for p in sys.path if p and os.path.isabs(p)]
_busy = []
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def _inside(path, roots):
    try:
        p = _real(os.fsdecode(path))
    except Exception:
        return False
    return p == "/dev/null" or any(p == r or p.startswith(r + os.sep) for r in roots)

def _note(kind, what):
    os.write(_fd, (json.dumps([kind, repr(what)]) + "\n").encode())

def _hook(event, args):
    if _busy:
        return
    _busy.append(1)
    try:
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path, mode, flags = args
            if (flags or 0) & _WRITE or (isinstance(mode, str) and any(c in mode for c in "wax+")):
                if not _inside(path, _write_ok):
                    _note("write", path)
            elif os.fsdecode(path).endswith((".py", ".pyc", ".so")) and not _inside(path, _code_ok):
                _note("import", path)
        elif event in ("os.remove", "os.rmdir", "shutil.rmtree", "os.truncate") and not isinstance(args[0], int):
            if not _inside(args[0], _write_ok):
                _note(event, args[0])
        elif event == "os.rename" and not (_inside(args[0], _write_ok) and _inside(args[1], _write_ok)):
            _note(event, args[:2])
        elif event == "socket.connect":
            _note(event, args[1])
    finally:
        _busy.clear()

sys.addaudithook(_hook)

def _prepare_printed_command(out):
    # what `python -m rlexp train <printed command>` does before it spawns anything, in this audited process
    import shlex
    line = next(x for x in out.splitlines() if x.startswith("+ "))
    argv = shlex.split(line[2:])
    argv = argv[argv.index("train") + 1:]
    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.config.validate import ConfigError
    from rlexp.core.plugins import with_config_path
    from rlexp.run.prepare import prepare
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    name = argv[argv.index("--config-name") + 1] if "--config-name" in argv else "train"
    overrides = [a for a in argv if "=" in a and not a.startswith(("hydra.", "--"))]
    try:
        prepare(compose_run_config(with_config_path(overrides), config_name=name))
    except (ConfigError, ValueError, FileNotFoundError, HydraException, OmegaConfBaseException) as e:
        # `rlexp train` answers these with one line and exit 2 before anything spawns
        print(f"re-run refused before spawning: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0

argv = sys.argv[1:]
from rlexp.cli import main
if os.environ.get("RLEXP_AUDIT_PREPARE") == "1":
    import contextlib, io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    sys.stdout.write(buf.getvalue())
    if rc == 0:
        rc = _prepare_printed_command(buf.getvalue())
else:
    rc = main(argv)
sys.stdout.flush()
sys.stderr.flush()
os._exit(rc or 0)
"""

# rlexp's own cache (the tiny model's checkpoint): the training run below fills it, the children only read it.
CACHE = Path(os.environ.get("RLEXP_CACHE", Path.home() / ".cache" / "rlexp"))
EVIL = "import os\nopen(os.environ['RLEXP_FUZZ_SENTINEL'], 'a').write('{name} ran\\n')\nclass Env: pass\n"


@dataclass
class Case:
    name: str
    command: str  # reproduce | eval | compare
    mutate: Callable[[Path, Path], None]  # (run folder copy, victim folder)
    args: tuple[str, ...] = ()
    # reproduce: when the gate lets it through, also run what the re-run does before spawning (seconds: torch).
    # Off for plain-data mutations, which are expected to pass; on for every hostile one, which should not.
    prepare: bool = True


@pytest.fixture(scope="module")
def finished_run(checkpointed_run: CheckpointedRun) -> Path:
    """One real finished run (2 steps, tiny model, checkpoints/final for `eval run=`): the session's
    `checkpointed_run` (conftest.py; tests/test_run_folder_links.py and tests/test_run_integrity.py
    read it too), never written: every case mutates its own copy."""
    run = checkpointed_run.run
    assert checkpointed_run.returncode == 0, checkpointed_run.stderr[-3000:]
    assert (run / "checkpoints" / "final" / "config.json").is_file()
    return run


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _edit(fn: Callable[[dict, Path, Path], None]) -> Callable[[Path, Path], None]:
    def mutate(run: Path, victim: Path) -> None:
        m = _manifest(run)
        fn(m, run, victim)
        (run / "manifest.json").write_text(json.dumps(m))
    return mutate


def _plant(run: Path, name: str) -> None:
    (run / f"{name}.py").write_text(EVIL.format(name=name))


def _fill(text: str, run: Path, victim: Path) -> str:
    return text.replace("{victim}", str(victim)).replace("{run}", str(run))


def _override(text: str, module: str | None = None) -> Callable[[Path, Path], None]:
    def fn(m: dict, run: Path, victim: Path) -> None:
        if module:
            _plant(run, module)
        m["overrides"] = [*m["overrides"], _fill(text, run, victim)]
    return _edit(fn)


def _config(path: str, value: object, module: str | None = None) -> Callable[[Path, Path], None]:
    def fn(m: dict, run: Path, victim: Path) -> None:
        if module:
            _plant(run, module)
        node = m["config"]
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = _fill(value, run, victim) if isinstance(value, str) else value
    return _edit(fn)


def _finding1_in_folder(m: dict, run: Path, victim: Path) -> None:
    """Finding 1 as reported: the module in the run folder, the manifest naming it, no working folder recorded
    (so the one the command runs in, the run folder, was searched)."""
    _plant(run, "evilmod")
    m["config"]["environment"]["name"] = "evilmod:Env"
    m["hydra"]["runtime_cwd"] = None


def fixed_cases(listener_port: int) -> list[Case]:
    """Issue 41's findings 1-4, as reported, plus their neighbours."""
    return [
        Case("finding1 eval run= imports config.environment.name from the folder", "eval",
             _config("environment.name", "evilmod:Env", "evilmod")),
        Case("finding1 eval run=. from inside the folder, runtime_cwd unset", "eval", _edit(_finding1_in_folder)),
        Case("finding2 quoted class path passes the reproduce gate", "reproduce",
             _override("environment.name='evilmod2:Env'", "evilmod2")),
        Case("finding3 manifest tracking_uri gets the token", "reproduce",
             _override(f"logger.mlflow.tracking_uri=http://127.0.0.1:{listener_port}")),
        Case("finding3 with the mlflow logger on", "reproduce",
             _override(f"logger.mlflow.tracking_uri='http://127.0.0.1:{listener_port}/x'")),
        Case("finding4 cluster.shm_dir deletes a folder's contents", "reproduce",
             _override("cluster.shm_dir={victim}")),
        Case("a run's own cwd named as its plug-in folder", "reproduce",
             _edit(lambda m, r, v: (_plant(r, "evilcwd"), m["overrides"].append("plugins=[evilcwd]")))),
        Case("untouched run: reproduce passes, the re-run's checks run", "reproduce", lambda r, v: None),
        Case("untouched run: compare", "compare", lambda r, v: None),
    ]


# Seeded mutations: each draws a template, a key or value, and a quoting.
_CODE_KEYS = ["environment.name", "reward.name", "algorithm.loss", "cluster.job", "cluster.transport",
              "environment.options.rule", "reward.options.rule", "environment.options.x"]
_PLACE_KEYS = ["cluster.shm_dir", "model.path", "logger.runs_root", "resume", "environment.dataset",
               "cluster.job_options.kubeconfig", "reward.options.cache_dir", "environment.options.out"]
_URL_KEYS = ["logger.mlflow.tracking_uri", "logger.wandb.entity", "reward.options.base_url", "extra.url"]
_QUOTES = ["{v}", "'{v}'", '"{v}"', "'{v} '", "{v}\\ "]


def _quoted(rng: random.Random, value: str) -> str:
    return rng.choice(_QUOTES).format(v=value)


def seeded_cases(seed: int, n: int, listener_port: int) -> list[Case]:
    rng = random.Random(seed)
    out: list[Case] = []
    for i in range(n):
        mod = f"fuzzmod{seed}_{i}"
        kind = rng.choice(["code", "place", "url", "interp", "target", "config", "files", "data", "plugins"])
        if kind == "code":
            key = rng.choice(_CODE_KEYS)
            text = f"{key}={_quoted(rng, f'{mod}:Env')}"
            out.append(Case(f"{i} {text}", "reproduce", _override(text, mod)))
        elif kind == "place":
            key = rng.choice(_PLACE_KEYS)
            text = f"{key}={_quoted(rng, '{victim}/' + rng.choice(['', 'x.jsonl', 'sub', '../victim']))}"
            out.append(Case(f"{i} {text}", "reproduce", _override(text)))
        elif kind == "url":
            key = rng.choice(_URL_KEYS)
            value = rng.choice([f"http://127.0.0.1:{listener_port}", "file://{victim}", "user@127.0.0.1:x"])
            text = f"{key}={_quoted(rng, value)}"
            out.append(Case(f"{i} {text}", "reproduce", _override(text)))
        elif kind == "interp":
            text = rng.choice(["environment.name=${extra.e}", "logger.wandb.project=${oc.env:HOME}",
                               "environment.name=${environment.split}", "seed=${oc.decode:'1'}",
                               "environment.options.rule=${extra.e}", "environment.split=${extra.e}"])
            plant = _override(f"+extra.e='{mod}:Env'", mod)
            out.append(Case(f"{i} {text}", "reproduce",
                            lambda r, v, t=text, p=plant: (p(r, v), _override(t)(r, v))))
        elif kind == "target":
            text = rng.choice([f"+environment.options._target_={mod}.Env", f"+extra.x={{_target_: {mod}.Env}}",
                               f"+hydra.callbacks.x._target_={mod}.Env", f"environment.options={{_target_: {mod}.E}}"])
            out.append(Case(f"{i} {text}", "reproduce", _override(text, mod)))
        elif kind == "config":
            path, value = rng.choice([
                ("environment.name", f"{mod}:Env"), ("environment.name", f" {mod} : Env "),
                ("environment.options", {"rule": f"{mod}:Env"}), ("environment.dataset", "{victim}/x.jsonl"),
                ("environment._target_", f"{mod}.Env"), ("environment", f"{mod}:Env"),
                ("algorithm.max_tokens", "1e99"), ("environment.name", "../../evil"),
            ])
            out.append(Case(f"{i} eval config.{path}={value!r}", "eval", _config(path, value, mod)))
        elif kind == "files":
            what = rng.choice(["manifest symlink", "metrics symlink", "huge overrides", "deep config", "not json",
                               "metrics garbage"])
            # compare on a damaged metrics.jsonl is issue 41's item 7 (compare as a hostile reader), not this gate
            commands = ["reproduce", "eval"] + (["compare"] if what != "metrics garbage" else [])
            out.append(Case(f"{i} {what}", rng.choice(commands), _file_mutation(what)))
        elif kind == "plugins":
            entry = {"module": mod, "file": rng.choice([f"{mod}.py", "{run}/" + f"{mod}.py"]), "sha256": "0" * 64,
                     "by_name": rng.random() < 0.5}

            def fn(m: dict, r: Path, v: Path, e: dict = entry, name: str = mod) -> None:
                _plant(r, name)
                m["plugins"] = [{**e, "file": e["file"].format(run=r)}]
            out.append(Case(f"{i} plugins entry {entry['file']}", rng.choice(["reproduce", "eval"]), _edit(fn)))
        else:  # plain data: must pass and run the re-run's checks without a single event
            text = rng.choice(["seed=7", "steps=3", "'algorithm.temperature=0.5'", "+extra.note='a:b /c http://d'",
                               "environment.options={max_operand: 9}", "tags=[x,'y:z']"])
            out.append(Case(f"{i} data {text}", "reproduce", _override(text), prepare=False))
    return out


def _file_mutation(what: str) -> Callable[[Path, Path], None]:
    def mutate(run: Path, victim: Path) -> None:
        if what == "manifest symlink":
            (victim / "manifest.json").write_text((run / "manifest.json").read_text())
            (run / "manifest.json").unlink()
            (run / "manifest.json").symlink_to(victim / "manifest.json")
        elif what == "metrics symlink":
            (victim / "m.jsonl").write_text('{"step": 0, "reward/mean": 1}\n')
            (run / "metrics.jsonl").unlink()
            (run / "metrics.jsonl").symlink_to(victim / "m.jsonl")
        elif what == "huge overrides":
            m = _manifest(run)
            m["overrides"] += ["seed=1"] * 2000 + ["seed=" + "1" * 100000]
            (run / "manifest.json").write_text(json.dumps(m))
        elif what == "deep config":
            text = (run / "manifest.json").read_text()
            (run / "manifest.json").write_text('{"deep": ' + '{"a": ' * 5000 + "{}" + "}" * 5000 + "," + text[1:])
        elif what == "not json":
            (run / "manifest.json").write_bytes(b"\xff\xfe{not json")
        elif what == "metrics garbage":
            (run / "metrics.jsonl").write_text('[1]\n{"step": "two"}\nNaN\n{"step": 1, "x": Infinity}\n')
    return mutate


def _run_case(case: Case, source: Path, root: Path, port: int) -> tuple[subprocess.CompletedProcess, list, Path]:
    work = root / re.sub(r"[^A-Za-z0-9]+", "_", case.name)[:60]
    run, victim, tmp = work / "run", work / "victim", work / "tmp"
    victim.mkdir(parents=True)
    tmp.mkdir()
    shutil.copytree(source, run, ignore=shutil.ignore_patterns("step_*", "tables", "eval_samples"))
    (victim / "keep.txt").write_text("mine\n")
    case.mutate(run, victim)
    log, sentinel = work / "audit.jsonl", victim / "sentinel.txt"
    out = tmp / "out"
    argv = {"reproduce": ["reproduce", str(run), "--dry-run"],
            "eval": ["eval", f"run={run}", "max_samples=2", "batch_size=2", "--out", str(out)],
            "compare": ["compare", str(run), "--out", str(out)]}[case.command]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_", "PYTHON"))}
    env.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", TMPDIR=str(tmp), HOME=str(tmp),
               MPLCONFIGDIR=str(tmp / "mpl"), RLEXP_AUDIT_LOG=str(log), RLEXP_FUZZ_SENTINEL=str(sentinel),
               RLEXP_AUDIT_WRITE_OK=json.dumps([str(run), str(tmp), str(CACHE)]), RLEXP_CACHE=str(CACHE),
               RLEXP_AUDIT_PREPARE="1" if case.command == "reproduce" and case.prepare else "0",
               MLFLOW_TRACKING_TOKEN="s3cr3t-token", WANDB_MODE="offline", HF_HUB_OFFLINE="1",
               HTTP_PROXY=f"http://127.0.0.1:{port}", HTTPS_PROXY=f"http://127.0.0.1:{port}")
    p = subprocess.run([sys.executable, "-P", "-c", BOOT, *argv, *case.args], cwd=run, env=env,
                       capture_output=True, text=True, timeout=120)
    events = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    if sentinel.exists():
        events.append(["sentinel", sentinel.read_text()])
    if not (victim / "keep.txt").is_file():
        events.append(["deleted", str(victim / "keep.txt")])
    return p, events, victim


def _check(case: Case, p: subprocess.CompletedProcess, events: list) -> str | None:
    """None when the case held; else what went wrong, one line."""
    if events:
        return f"{case.name}: events {events[:5]}\n{p.stderr[-1500:]}"
    if "Traceback" in p.stderr or p.returncode not in (0, 2):
        return f"{case.name}: exit {p.returncode}\n{p.stderr[-3000:]}"
    if p.returncode == 2 and not p.stderr.strip():
        return f"{case.name}: refused without a message"
    return None


@pytest.fixture(scope="module")
def listener() -> NetListener:
    n = NetListener()
    yield n
    n.close()


def test_the_four_findings_are_closed(finished_run: Path, tmp_path: Path, listener: NetListener) -> None:
    failures, outcomes = [], {}
    for case in fixed_cases(listener.port):
        p, events, victim = _run_case(case, finished_run, tmp_path, listener.port)
        outcomes[case.name] = p.returncode
        failures.append(_check(case, p, events))
        if case.name.startswith("finding"):  # each is refused, naming the key, before anything runs
            assert p.returncode == 2 and "refus" in p.stderr, (case.name, p.stdout[-500:], p.stderr[-1500:])
        if case.name.startswith("finding4"):
            assert (victim / "keep.txt").read_text() == "mine\n"
            assert "cluster.shm_dir" in p.stderr
    assert listener.seen == []
    assert [f for f in failures if f] == []
    assert outcomes["untouched run: reproduce passes, the re-run's checks run"] == 0
    assert outcomes["untouched run: compare"] == 0
    # The control: the user vouches for the folder, so finding 1's module is imported, and the hook sees it.
    control = Case("control trusted", "eval", _edit(_finding1_in_folder), args=("--trust-plugins",))
    p, events, _ = _run_case(control, finished_run, tmp_path, listener.port)
    assert {"import", "write", "sentinel"} <= {e[0] for e in events}, (events, p.stderr[-2000:])


@pytest.mark.parametrize("seed", [41])
def test_seeded_hostile_mutations_complete_or_are_refused_with_no_side_effect(
        finished_run: Path, tmp_path: Path, listener: NetListener, seed: int) -> None:
    cases = seeded_cases(seed, int(os.environ.get("RLEXP_FUZZ_CASES", "20")), listener.port)
    failures = []
    for case in cases:
        p, events, _ = _run_case(case, finished_run, tmp_path, listener.port)
        failures.append(_check(case, p, events))
    assert listener.seen == []
    assert [f for f in failures if f] == []
