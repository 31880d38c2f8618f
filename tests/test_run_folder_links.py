"""A run folder is written and uploaded without following links (issue 41, finding 5), and a run folder that
cannot be used ends in one message naming the problem and the fix: links and special files inside it, a `.lock`
that is not a regular file, a read-only folder, `checkpoint.keep=0`, a W&B project that reads as a path.

Fast tests use the real writers, a real MLflow SQLite store and W&B offline in-process; the `slow` ones run
`rlexp train` on a copy of one short finished run (the session's `checkpointed_run`), as finding 5
did."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.core.runfolder import RunFolderUnsafe, artifact_files, check_run_folder
from rlexp.evals.results import write_samples
from rlexp.run.runlock import LOCK_FILE, hold
from rlexp.tracking.base import JsonlTracker
from rlexp.tracking.files import atomic_write_text
from rlexp.tracking.manifest import Manifest, write_start_manifest
from rlexp.tracking.registry import build_trackers
from tests.conftest import CHECKPOINTED, REPO, CheckpointedRun, tagged_env

SECRET = f"S3CRET-{uuid.uuid4().hex}"


def _outside(tmp_path: Path) -> Path:
    """Files a hostile run folder points at: a secret, a lock target, a log, a folder with a secret in it."""
    out = tmp_path / "outside"
    (out / "samples").mkdir(parents=True)
    (out / "secret.txt").write_text(SECRET + "\n")
    (out / "samples" / "secret.txt").write_text(SECRET + "\n")
    (out / "lock").write_text("the lock target's own content\n")
    (out / "log").write_text("the log target's own content\n")
    return out


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _plant_finding_5(run: Path, out: Path) -> None:
    """Finding 5's folder: `.lock`, `train.log` and `eval_samples` are links outside, beside a linked secret."""
    for name in (LOCK_FILE, "train.log", "eval_samples"):
        p = run / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif os.path.lexists(p):
            p.unlink()
    (run / LOCK_FILE).symlink_to(out / "lock")
    (run / "train.log").symlink_to(out / "log")
    (run / "eval_samples").symlink_to(out / "samples", target_is_directory=True)
    (run / "secret.txt").symlink_to(out / "secret.txt")


def _files_with_secret(root: Path, skip: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and skip not in p.parents
            and SECRET.encode() in p.read_bytes()]


# --------------------------------------------------------------------------------------------- the check
def test_links_inside_a_run_folder_are_refused_naming_them_and_nothing_outside_changes(tmp_path: Path) -> None:
    out, run = _outside(tmp_path), tmp_path / "run"
    run.mkdir()
    _plant_finding_5(run, out)
    before = _snapshot(out)
    with pytest.raises(RunFolderUnsafe) as e, hold(run):
        pass
    msg = str(e.value)
    for name in (LOCK_FILE, "train.log", "eval_samples", "secret.txt"):
        assert f"{run / name} is a link to {out}" in msg, msg
    assert "Remove them" in msg and "hydra.run.dir=" in msg
    assert _snapshot(out) == before  # the lock target was neither truncated nor written


def test_the_run_folder_itself_may_be_a_link(tmp_path: Path) -> None:
    """Links above the run folder are the user's choice (runs/ on scratch): only links inside it are refused."""
    scratch = tmp_path / "scratch"
    (scratch / "run").mkdir(parents=True)
    (tmp_path / "runs").symlink_to(scratch, target_is_directory=True)
    with hold(tmp_path / "runs" / "run"):
        assert json.loads((scratch / "run" / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_links_inside_wandb_pass_and_wandb_itself_as_a_link_does_not(tmp_path: Path) -> None:
    """`wandb/` is W&B's own area (its links lead to its cache); the folder itself must be real."""
    run = tmp_path / "run"
    w = run / "wandb"
    (w / "offline-run-1" / "logs").mkdir(parents=True)
    (w / "latest-run").symlink_to("offline-run-1")
    (w / "offline-run-1" / "logs" / "debug-core.log").symlink_to(tmp_path / "cache.log")
    check_run_folder(run)
    shutil.move(w, tmp_path / "elsewhere")
    w.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(RunFolderUnsafe, match=r"run/wandb is a link to"):
        check_run_folder(run)


@pytest.mark.parametrize("what", ["folder", "fifo", "link"])
def test_a_lock_that_is_not_a_regular_file_is_refused_naming_it(tmp_path: Path, what: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    lock = run / LOCK_FILE
    if what == "folder":
        lock.mkdir()
    elif what == "fifo":
        os.mkfifo(lock)
    else:
        (tmp_path / "target").write_text("keep me\n")
        lock.symlink_to(tmp_path / "target")
    said = {"folder": r"\.lock is a folder; it must be a regular file.*rm -r", "fifo": r"\.lock is a fifo",
            "link": r"\.lock is a link to"}[what]
    with pytest.raises(RunFolderUnsafe, match=said), hold(run):
        pass
    if what == "link":
        assert (tmp_path / "target").read_text() == "keep me\n"


def test_writers_refuse_a_link_planted_after_the_check(tmp_path: Path) -> None:
    """`metrics.jsonl`, a rollout table, eval samples and atomic writes' temporary files open without following
    a link, so one planted while the run goes on is refused rather than written through."""
    out = _outside(tmp_path)
    run = tmp_path / "run"
    (run / "tables").mkdir(parents=True)
    before = _snapshot(out)
    (run / "metrics.jsonl").symlink_to(out / "log")
    with pytest.raises(RunFolderUnsafe, match=r"metrics\.jsonl is a symbolic link"):
        JsonlTracker().start({}, run, Manifest())
    (run / "metrics.jsonl").unlink()
    jt = JsonlTracker()
    jt.start({}, run, Manifest())
    (run / "tables" / "rollouts.jsonl").symlink_to(out / "log")
    with pytest.raises(RunFolderUnsafe, match=r"rollouts\.jsonl is a symbolic link"):
        jt.log_table("rollouts", [{"a": 1}])
    jt.finish("completed")
    (run / "eval_samples").mkdir()
    (run / "eval_samples" / "train_step000002.jsonl").symlink_to(out / "log")
    with pytest.raises(RunFolderUnsafe, match=r"train_step000002\.jsonl is a symbolic link"):
        write_samples(run / "eval_samples" / "train_step000002.jsonl", [])
    (run / f".manifest.json.tmp.{os.getpid()}").symlink_to(out / "lock")
    with pytest.raises(RunFolderUnsafe, match=r"manifest\.json\.tmp"):
        atomic_write_text(run / "manifest.json", "{}")
    assert _snapshot(out) == before


def _without_dac_override(code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a child that file permissions bind: as root, without CAP_DAC_OVERRIDE (a real kernel
    permission check, as any other user meets it); as another user, unchanged."""
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: permission bits cannot bind this process")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_a_read_only_run_folder_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    for p in (run / "metrics.jsonl", run, tmp_path):  # tmp_path: the child must reach the folder, not write it
        p.chmod(0o555 if p.is_dir() else 0o444)
    try:
        code = ("from pathlib import Path; from rlexp.errors import friendly_errors; "
                "from rlexp.run.runlock import hold\n"
                f"with friendly_errors(), hold(Path({str(run)!r})): print('held')")
        p = _without_dac_override(code)
    finally:
        for q in (tmp_path, run, run / "metrics.jsonl"):
            q.chmod(0o755 if q.is_dir() else 0o644)
    assert p.returncode == 2 and "held" not in p.stdout, p.stdout + p.stderr
    assert f"rlexp: error: run folder {run} cannot be written: {run}, {run / 'metrics.jsonl'} (read-only)" \
        in p.stderr and f"chmod -R u+w {run}" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_artifact_files_are_only_regular_files_inside_the_run_folder(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out, run = _outside(tmp_path), tmp_path / "run"
    (run / "eval_samples" / "live").mkdir(parents=True)
    (run / "eval_samples" / "a.jsonl").write_text("a")
    (run / "eval_samples" / "live" / "b.jsonl").write_text("b")
    (run / "eval_samples" / "secret.txt").symlink_to(out / "secret.txt")
    (run / "eval_samples" / "more").symlink_to(out / "samples", target_is_directory=True)
    os.mkfifo(run / "eval_samples" / "pipe")
    got = [(str(f.relative_to(run)), str(rel)) for f, rel in artifact_files(run / "eval_samples", run)]
    assert got == [("eval_samples/a.jsonl", "a.jsonl"), ("eval_samples/live/b.jsonl", "live/b.jsonl")]
    err = capsys.readouterr().err
    assert "not uploading" in err and "secret.txt (a link)" in err and "more (a link)" in err and "pipe (a fifo)" in err
    (run / "linked").symlink_to(out / "samples", target_is_directory=True)
    assert artifact_files(run / "linked", run) == [] and artifact_files(out / "secret.txt", run) == []
    assert artifact_files(run / "eval_samples" / "a.jsonl", run) == [(run / "eval_samples" / "a.jsonl",
                                                                     Path("a.jsonl"))]


# --------------------------------------------------------------------------------------------- uploads
def _cfg(tmp_path: Path, wandb: bool = False, mlflow: bool = False):
    return OmegaConf.create({
        "seed": 1, "model": {"name": "tiny"},
        "logger": {"wandb": {"enabled": wandb, "mode": "offline", "project": "rlexp-test", "entity": None},
                   "mlflow": {"enabled": mlflow, "tracking_uri": f"sqlite:///{tmp_path}/store/mlflow.db",
                              "experiment": "links"},
                   "log_every_n_steps": 1, "rollout_samples": 2, "runs_root": None},
    })


def _upload_with_links(tmp_path: Path, cfg) -> tuple[Path, Path]:
    """A run whose folder gains links to an outside secret after its check (in `.hydra/`, `eval_samples/`, the
    final checkpoint, and as `eval_samples` itself): what each tracker uploads at the end."""
    out, run = _outside(tmp_path), tmp_path / "run"
    manifest = write_start_manifest(run, cfg, ["rlexp", "train"], {"global": 1}, {})
    with build_trackers(cfg.logger, cfg, run, manifest) as tr:
        tr.log({"reward/mean": 0.5}, 1)
        final = run / "checkpoints" / "final"
        final.mkdir(parents=True)
        (final / "config.json").write_text("{}")
        (final / "secret.txt").symlink_to(out / "secret.txt")
        tr.log_artifact(final, kind="checkpoint")
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text("seed: 1\n")
        (run / ".hydra" / "overrides.yaml").symlink_to(out / "secret.txt")
        (run / "eval_samples").symlink_to(out / "samples", target_is_directory=True)
        (run / "eval_results.json").symlink_to(out / "secret.txt")
    return out, run


def test_mlflow_uploads_no_file_reached_through_a_link(tmp_path: Path, offline_trackers: None) -> None:
    from mlflow.tracking import MlflowClient

    cfg = _cfg(tmp_path, mlflow=True)
    out, run = _upload_with_links(tmp_path, cfg)
    client = MlflowClient(tracking_uri=cfg.logger.mlflow.tracking_uri)
    run_id = json.loads((run / "manifest.json").read_text())["trackers"]["mlflow"]["run_id"]

    def listed(path: str | None = None) -> set[str]:
        found = set()
        for a in client.list_artifacts(run_id, path):
            found |= listed(a.path) if a.is_dir else {a.path}
        return found

    got = listed()
    assert {"checkpoints/final/config.json", ".hydra/config.yaml", "manifest.json", "metrics.jsonl"} <= got, got
    assert not {"checkpoints/final/secret.txt", ".hydra/overrides.yaml", "eval_results.json"} & got, got
    assert not any(p.startswith("eval_samples") for p in got), got
    assert _files_with_secret(tmp_path / "store", skip=out) == []


def test_wandb_offline_uploads_no_file_reached_through_a_link(tmp_path: Path, offline_trackers: None) -> None:
    from rlexp.tracking.runs import load_wandb_dir

    cfg = _cfg(tmp_path, wandb=True)
    out, run = _upload_with_links(tmp_path, cfg)
    (rec,) = load_wandb_dir(run / "wandb")
    arts = {a["name"]: a["files"] for a in rec.manifest["wandb"]["artifacts"] if a["type"] != "run_table"}
    assert arts["checkpoint"] == ["config.json"] and arts["config"] == [".hydra/config.yaml"], arts
    assert _files_with_secret(tmp_path, skip=out) == []


def test_a_real_wandb_folder_passes_the_check(tmp_path: Path, offline_trackers: None) -> None:
    """The links W&B itself makes in `wandb/` (latest-run, debug logs) do not block resuming a W&B run."""
    cfg = _cfg(tmp_path, wandb=True)
    run = tmp_path / "run"
    with build_trackers(cfg.logger, cfg, run, write_start_manifest(run, cfg, ["rlexp"], {"global": 1}, {})) as tr:
        tr.log({"reward/mean": 0.5}, 1)
    made = [str(p.relative_to(run)) for p in (run / "wandb").rglob("*") if p.is_symlink()]
    assert made, f"W&B made no link: this test checks nothing ({sorted(os.listdir(run / 'wandb'))})"
    check_run_folder(run)
    with hold(run):
        pass


# --------------------------------------------------------------------------------------------- config
def _validate_error(*overrides: str) -> str:
    from hydra import compose, initialize_config_dir

    from rlexp.config.schema import register_configs
    from rlexp.config.validate import ConfigError, validate

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("train", overrides=list(overrides)))
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    return str(e.value)


def test_checkpoint_keep_zero_is_refused_naming_the_fix() -> None:
    msg = _validate_error("checkpoint.keep=0", "checkpoint.every_n_steps=2")
    assert "checkpoint.keep=0 would delete every periodic checkpoint" in msg and "checkpoint.keep=1" in msg


@pytest.mark.parametrize("name", ["../..", "a/b", "..", "x:y", "a" * 129])
def test_a_wandb_project_that_is_not_a_wandb_name_is_refused(name: str) -> None:
    msg = _validate_error("logger=wandb", f"logger.wandb.project={name}")
    assert f"logger.wandb.project={name!r} is not a W&B name" in msg and "logger.wandb.project=rlexp" in msg


# --------------------------------------------------------------------------------------------- end to end
TINY = CHECKPOINTED  # the config of the session's `checkpointed_run`, which a resume must keep


@pytest.fixture(scope="module")
def finished_run(checkpointed_run: CheckpointedRun) -> Path:
    """One short finished run (a checkpoint at step 1, eval samples), copied by each test: the
    session's `checkpointed_run` (conftest.py), which tests/test_run_integrity.py reads too."""
    assert checkpointed_run.returncode == 0, checkpointed_run.stderr[-3000:]
    return checkpointed_run.run


def _train(run: Path, *args: str, cwd: Path, tag: str, setpriv: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlexp", "train", "resume=auto", "steps=3", *TINY, *args, f"hydra.run.dir={run}"]
    if setpriv:
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *cmd]
    return subprocess.run(cmd, cwd=cwd, env=tagged_env(tag), capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_finding_5_a_linked_run_folder_is_refused_then_resumes_once_the_links_are_gone(
        finished_run: Path, tmp_path: Path, tag: str) -> None:
    out = _outside(tmp_path)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    _plant_finding_5(run, out)
    before, hydra_before = _snapshot(out), _snapshot(run / ".hydra")
    store = f"logger.mlflow.tracking_uri=sqlite:///{tmp_path}/store/mlflow.db"
    p = _train(run, "logger=mlflow", store, cwd=tmp_path, tag=tag)
    errors = [x for x in p.stderr.splitlines() if x.startswith("rlexp: error:")]
    assert p.returncode == 2 and len(errors) == 1 and "Traceback" not in p.stderr + p.stdout, p.stderr
    for name in (LOCK_FILE, "train.log", "eval_samples", "secret.txt"):
        assert f"{run / name} is a link to" in errors[0]
    assert _snapshot(out) == before and _snapshot(run / ".hydra") == hydra_before  # nothing written anywhere
    assert not (tmp_path / "store").exists()  # refused before any tracker started
    for name in (LOCK_FILE, "train.log", "eval_samples", "secret.txt"):  # the fix the message gives
        (run / name).unlink()
    p = _train(run, "logger=mlflow", store, cwd=tmp_path, tag=tag)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed from" in p.stdout and _snapshot(out) == before
    assert any((tmp_path / "store").rglob("manifest.json")) and _files_with_secret(tmp_path, skip=out) == []


@pytest.mark.slow
@pytest.mark.parametrize("what", ["lock folder", "read-only", "wandb project", "keep=0"])
def test_an_unusable_run_folder_or_output_setting_ends_in_one_message(finished_run: Path, tmp_path: Path, tag: str,
                                                                      what: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    args: list[str] = []
    setpriv = False
    if what == "lock folder":
        (run / LOCK_FILE).unlink()
        (run / LOCK_FILE).mkdir()
        said = f"the run-folder lock {run / LOCK_FILE} is a folder"
    elif what == "read-only":
        if os.geteuid() == 0 and shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: permission bits cannot bind the run")
        setpriv = os.geteuid() == 0
        subprocess.run(["chmod", "-R", "a-w", str(run)], check=True)
        said = f"run folder {run} cannot be written"
    elif what == "wandb project":
        args = ["logger=wandb", "logger.wandb.project=../.."]
        said = "logger.wandb.project='../..' is not a W&B name"
    else:
        args = ["checkpoint.keep=0"]
        said = "checkpoint.keep=0 would delete every periodic checkpoint"
    before = _snapshot(run / "checkpoints")
    try:
        p = _train(run, *args, cwd=tmp_path, tag=tag, setpriv=setpriv)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(run)], check=True)
    errors = [x for x in p.stderr.splitlines() if x.startswith("rlexp: error:")]
    assert p.returncode == 2 and len(errors) == 1 and said in errors[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr + p.stdout and "actor graph" not in p.stdout
    assert _snapshot(run / "checkpoints") == before
