"""The config boundary through the real CLI: what a run folder says (a manifest mailed by a colleague) and what a
user types are refused before anything spawns, naming the key, with exit code 2 and no traceback."""
from __future__ import annotations

import json
import time
from pathlib import Path

from cli_batch import rlexp_each
from conftest import rlexp, tagged_env, tagged_pids
from omegaconf import OmegaConf

from rlexp.tracking.manifest import write_start_manifest


def _run_folder(run: Path) -> Path:
    """A finished run's folder as rlexp writes it (manifest and Hydra's copies), without training."""
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
    cfg = OmegaConf.create({"seed": 3})
    write_start_manifest(run, cfg, ["rlexp", "train", "seed=3"], {"global": 3}, {}, repo_dir=run)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.1}) + "\n")
    return run


def test_reproduce_refuses_a_manifest_that_would_write_a_file(tmp_path: Path, tag: str) -> None:
    run = _run_folder(tmp_path / "runs" / "a")
    target = tmp_path / "pwned.pth"
    m = json.loads((run / "manifest.json").read_text())
    m["overrides"] += ["+hydra.callbacks.x._target_=pathlib.Path.write_text",
                       f"+hydra.callbacks.x._args_=[{{_target_:pathlib.Path,_args_:[{target}]}},'import os']"]
    (run / "manifest.json").write_text(json.dumps(m))
    start = time.monotonic()
    p = rlexp("reproduce", str(run), tag=tag, check=False, timeout=60)
    took = time.monotonic() - start
    assert p.returncode == 2, p.stdout + p.stderr
    assert "+hydra.callbacks.x._target_=pathlib.Path.write_text" in p.stderr and "manifest.json" in p.stderr
    assert "Traceback" not in p.stderr
    assert not target.exists()
    assert not (run.parent / "reproduce").exists() and "+ " not in p.stdout  # no train command was started
    assert took < 30 and not tagged_pids(tag)


def test_reproduce_refuses_resolvers_and_a_config_dir_from_the_manifest(tmp_path: Path, tag: str) -> None:
    run = _run_folder(tmp_path / "runs" / "a")
    m = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**m, "overrides": ["logger.wandb.project=${oc.env:HOME}"]}))
    p = rlexp("reproduce", str(run), "--dry-run", tag=tag, check=False, timeout=60)
    assert p.returncode == 2 and "logger.wandb.project=${oc.env:HOME}" in p.stderr, p.stderr
    evil = run / "conf"
    evil.mkdir()
    (evil / "train.yaml").write_text("hydra:\n  callbacks: {}\n")
    m["hydra"] = {**(m.get("hydra") or {}), "config_dir": str(evil), "config_name": "train"}
    (run / "manifest.json").write_text(json.dumps(m))
    p = rlexp("reproduce", str(run), "--dry-run", tag=tag, check=False, timeout=60)
    assert p.returncode == 2 and f"--config-dir {evil}" in p.stderr, p.stderr
    # the user may pass the folder themselves, once they have looked at it
    p = rlexp("reproduce", str(run), "--dry-run", "--config-dir", str(evil), tag=tag, check=False, timeout=60)
    assert p.returncode == 0 and f"--config-dir {evil}" in p.stdout, p.stderr


def test_train_refuses_nan_learning_rate_before_spawning(tmp_path: Path, tag: str) -> None:
    values = ("nan", "inf", "-inf")
    start = time.monotonic()  # the three in one child (tests/cli_batch.py), each with its own exit and stderr
    done = rlexp_each([["train", f"trainer.lr={v}", f"hydra.run.dir={tmp_path / v}"] for v in values],
                      env=tagged_env(tag), timeout=120)
    for p in done:
        assert p.returncode == 2, p.stdout + p.stderr
        assert "trainer.lr" in p.stderr and "finite" in p.stderr and "Traceback" not in p.stderr
    # all three within the bound one had: seconds on a quiet machine; 60+ at load 10
    assert time.monotonic() - start < 120 and not tagged_pids(tag)


def test_train_refuses_a_misspelt_environment_option(tmp_path: Path, tag: str) -> None:
    p = rlexp("train", "+environment.options.nterms=5", f"hydra.run.dir={tmp_path / 'r'}", tag=tag, check=False,
              timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "'nterms'" in p.stderr and "did you mean n_terms" in p.stderr and "Traceback" not in p.stderr
    assert not tagged_pids(tag)


def test_checkpoint_meta_is_checked_for_shape(tmp_path: Path) -> None:
    import pytest

    from rlexp.run.checkpoints import ResumeError, read_meta

    (tmp_path / "meta.json").write_text(json.dumps({"step": 3, "version": 3, "resume_hash": "ab"}))
    assert read_meta(tmp_path)["step"] == 3
    for bad in ('{"step": "3; rm -rf", "version": 3, "resume_hash": "ab"}', "[1, 2]", "not json",
                '{"step": -1, "version": 0, "resume_hash": "ab"}', '{"step": 1, "version": 1}'):
        (tmp_path / "meta.json").write_text(bad)
        with pytest.raises(ResumeError, match=r"meta\.json"):
            read_meta(tmp_path)


def test_generator_replicas_file_takes_only_a_count(tmp_path: Path, capsys) -> None:
    from types import SimpleNamespace

    from rlexp.run.elastic import Elastic

    added = []
    graph = SimpleNamespace(services=None, add_generator=lambda: added.append(1))  # no actors: nothing to resize
    el = Elastic(graph, tmp_path)  # type: ignore[arg-type]
    for text in ("__import__('os')", "-3", "1e9", "9" * 50):
        (tmp_path / "generator_replicas").write_text(text)
        el.check()
        assert "is not a number of replicas; ignored" in capsys.readouterr().out, text
    assert not added


def test_train_refuses_added_keys_outside_the_schema_and_instantiation_keys(tmp_path: Path) -> None:
    """`+key=` adds keys even to a structured config: `+trainer.x._target_=os.system` used to train 300 steps."""
    from rlexp.config.overrides import check_composed_keys
    from rlexp.config.validate import ConfigError

    cases = (("+trainer.x._target_=os.system", "trainer.x._target_: '_target_' would make Hydra"),
             ("+environment.options.y._partial_=true", "environment.options.y._partial_"),
             ("+reward.options.z._args_=[1]", "reward.options.z._args_"))
    # the three in one child (tests/cli_batch.py), each with its own exit code and output
    done = rlexp_each([["train", o, f"hydra.run.dir={tmp_path / 'r'}"] for o, _ in cases],
                      env=tagged_env(tmp_path.name), timeout=300)
    for (_, named), p in zip(cases, done):
        assert p.returncode == 2 and named in p.stderr and "Traceback" not in p.stderr, p.stdout + p.stderr
        assert "actors spawned" not in p.stdout
    check_composed_keys(OmegaConf.create({"environment": {"options": {"n_terms": 5}}}))  # free-form options pass
    try:
        check_composed_keys(OmegaConf.create({"seed": 0, "sed": 1}))
    except ConfigError as e:
        assert "sed: not a key" in str(e)
    else:
        raise AssertionError("an unknown top-level key passed")


def test_a_refused_run_leaves_no_secret_in_hydras_copies(tmp_path: Path) -> None:
    """An unknown key is refused before Hydra writes `.hydra/*.yaml` (rlexp.run.preflight), so nothing holds the
    value; a refusal after Hydra wrote them (after torch loads) finds them redacted by the callback, and removes
    the folder it created (tests/test_preflight.py)."""
    secret = "Zq9-not-a-real-pwd-7781"
    p = rlexp("train", f"+x.pwd={secret}", f"hydra.run.dir={tmp_path / 'r'}", check=False, timeout=120)
    assert p.returncode == 2 and "unknown key x.pwd" in p.stderr, p.stdout + p.stderr
    assert secret not in p.stdout + p.stderr
    written = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert not (tmp_path / "r").exists() and not [f for f in written if secret.encode() in f.read_bytes()]


def test_freeze_pad_row_is_refused_on_a_sharded_trainer_naming_the_fix() -> None:
    import pytest

    from rlexp.cluster.plan_cli import compose_run_config
    from rlexp.config.validate import ConfigError
    from rlexp.run.prepare import check_config

    check_config(compose_run_config(["trainer.freeze_pad_row=true"]))  # one rank: fine
    with pytest.raises(ConfigError, match=r"freeze_pad_row=true works on one trainer rank.*trainer_fsdp=1"):
        check_config(compose_run_config(["trainer.freeze_pad_row=true", "model.parallelism.trainer_fsdp=2"]))
