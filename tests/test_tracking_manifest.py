"""Manifest: fields, secret redaction, dirty-git diff, atomic finish, hashing helpers. Real git repo in tmp."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlexp.tracking.files import fingerprint_examples, hash_files
from rlexp.tracking.manifest import (
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    finish_manifest,
    read_manifest,
    write_start_manifest,
)
from rlexp.tracking.redact import REDACTED, is_secret_name
from rlexp.tracking.runconfig import config_hash


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.fixture
def dirty_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "code"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "train.py").write_text("lr = 1\n")
    _git(repo, "add", "train.py")
    _git(repo, "commit", "-q", "-m", "init")
    (repo / "train.py").write_text("lr = 2\n")  # uncommitted change
    (repo / "new_module.py").write_text("x = 3\n")  # untracked file
    return repo


def _cfg():
    return OmegaConf.create({
        "seed": 7,
        "model": {"name": "tiny", "tokenizer": "char"},
        "generator": {"max_tokens": 64, "temperature": 1.0},
        "logger": {"wandb": {"enabled": False, "api_key": "sk-live-123"}},
        "reward": {"name": "weaver", "hf_token": "hf_abc", "threshold": "${generator.temperature}"},
        "paths": {"run_dir": "/somewhere"},
        "db": {"password": "hunter2"},
    })


def test_manifest_fields_secrets_and_dirty_diff(tmp_path: Path, dirty_repo: Path, monkeypatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-999")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-secret-xyz")
    run = tmp_path / "runs" / "r1"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("- seed=7\n- reward=weaver\n- +reward.hf_token=hf_abc\n")
    datasets = {"arith/train": fingerprint_examples([{"q": "1+1", "a": "2"}])}
    m = write_start_manifest(
        run, _cfg(), ["rlexp", "train", "seed=7", "+reward.hf_token=hf_abc", "--api-key", "k123"],
        seeds={"global": 7, "generator": 8, "trainer": 9},
        extra={"determinism": {"deterministic_algorithms": True, "cublas_workspace": ":4096:8"},
               "datasets": datasets, "model": {"revision": "main", "sha256": "0" * 64}},
        repo_dir=dirty_repo,
    ).to_dict()
    on_disk = json.loads((run / "manifest.json").read_text())
    assert on_disk == json.loads(json.dumps(m, default=str)) == read_manifest(run).to_dict()
    assert m["schema"] == SCHEMA_VERSION
    text = (run / "manifest.json").read_text()
    for secret in ("sk-live-123", "hf_abc", "hunter2", "tok-999", "wandb-secret-xyz", "k123"):
        assert secret not in text, secret
    assert m["config"]["logger"]["wandb"]["api_key"] == REDACTED
    assert m["config"]["db"]["password"] == REDACTED
    assert m["config"]["generator"]["max_tokens"] == 64  # not a secret despite "token"
    assert m["config"]["model"]["tokenizer"] == "char"
    assert m["config"]["reward"]["threshold"] == 1.0  # resolved
    assert m["env"]["WANDB_API_KEY"] == REDACTED and m["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert m["overrides"] == ["seed=7", "reward=weaver", f"+reward.hf_token={REDACTED}"]
    assert m["argv"][-1] == REDACTED and "seed=7" in m["command"]
    assert m["status"] == "running" and m["start_time"] and m["end_time"] is None
    assert len(m["config_sha256"]) == 64
    assert m["seeds"] == {"global": 7, "generator": 8, "trainer": 9}
    assert m["determinism"]["deterministic_algorithms"] is True
    assert m["datasets"] == datasets and m["model"]["revision"] == "main"
    for pkg in ("torch", "vllm", "torchtitan", "torchmonarch", "hydra-core", "omegaconf", "wandb", "mlflow",
                "transformers", "safetensors", "math-verify", "numpy"):
        assert pkg in m["packages"]
    assert m["packages"]["hydra-core"] and m["packages"]["omegaconf"]
    sysinfo = m["system"]
    assert sysinfo["python"] and sysinfo["os"] and sysinfo["cpu_count"] >= 1
    assert sysinfo["gpu"]["count"] == 0 and sysinfo["gpu"]["models"] == []
    # git: commit + dirty + diff of tracked files beside the manifest; untracked files by name only
    g = m["git"]
    assert len(g["commit"]) == 40 and g["dirty"] is True and g["diff_file"] == "git.diff"
    assert g["untracked"] == ["new_module.py"]
    diff = (run / "git.diff").read_text()
    assert "-lr = 1" in diff and "+lr = 2" in diff and "new_module.py" not in diff and "x = 3" not in diff
    # The diff applies cleanly onto the commit: the run's tracked code can be rebuilt.
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(dirty_repo), str(clone))
    _git(clone, "checkout", "-q", g["commit"])
    _git(clone, "apply", str(run / "git.diff"))
    assert (clone / "train.py").read_text() == "lr = 2\n" and not (clone / "new_module.py").exists()


def test_finish_manifest_atomic_and_artifacts(tmp_path: Path, dirty_repo: Path) -> None:
    run = tmp_path / "r"
    write_start_manifest(run, _cfg(), ["rlexp", "train"], {"global": 1}, {}, repo_dir=dirty_repo)
    art = run / "eval.json"
    art.write_text('{"acc": 0.5}')
    m = finish_manifest(run, "completed", {"eval/accuracy": 0.5}, [art]).to_dict()
    assert m["status"] == "completed" and m["end_time"] and m["final_metrics"] == {"eval/accuracy": 0.5}
    assert m["artifacts"][0]["path"] == "eval.json" and len(m["artifacts"][0]["sha256"]) == 64
    assert m["config"]["seed"] == 7  # start fields kept
    assert not list(run.glob(".manifest.json.tmp*"))
    with pytest.raises(ValueError):
        finish_manifest(run, "done", {}, [])
    assert read_manifest(run).status == "completed"  # a rejected write leaves the old file intact


def test_config_hash_ignores_run_local_and_secrets() -> None:
    a = _cfg()
    b = _cfg()
    b.paths.run_dir = "/elsewhere"
    b.logger.wandb.enabled = True
    b.reward.hf_token = "other"
    assert config_hash(a) == config_hash(b)
    b.seed = 8
    assert config_hash(a) != config_hash(b)


def test_hash_helpers(tmp_path: Path) -> None:
    assert fingerprint_examples([1, 2]) != fingerprint_examples([2, 1])
    assert fingerprint_examples([{"a": 1, "b": 2}]) == fingerprint_examples([{"b": 2, "a": 1}])
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"\x00" * 10)
    (d / "sub" / "config.json").write_text("{}")
    h = hash_files(d)
    assert h == hash_files(d) and len(h) == 64
    (d / "sub" / "config.json").write_text('{"x": 1}')
    assert hash_files(d) != h


def test_secret_names() -> None:
    for n in ("api_key", "WANDB_API_KEY", "hfToken", "HF_TOKEN", "client-secret", "db_password", "apikey", "token",
              "api_keys", "hf_tokens", "authorization", "bearer", "passphrase", "cookie", "cookies", "session"):
        assert is_secret_name(n), n
    for n in ("max_tokens", "tokenizer", "seed", "kl_coef", "num_keys_total", "token_ids", "n_tokens",
              "kv_cache_gb", "max_num_batched_tokens"):
        assert not is_secret_name(n), n


def test_names_command_and_numerics(tmp_path: Path) -> None:
    """Runs are named by their overrides (swept keys first, then as Hydra's override_dirname sorts them); the
    recorded command pastes into a shell; the machine's numerics (what decides bitwise identity) are recorded."""
    import shlex
    import subprocess

    from rlexp.tracking.hydra_run import name_from_overrides, shell_command, sweep_params
    from rlexp.tracking.system import numerics_info

    overrides = ["steps=30", "seed=0", "reward=rule", "logger=all", "logger.runs_root=/x", "hydra.run.dir=/y",
                 "+sweeps=grid"]
    assert name_from_overrides(overrides, {"seed", "reward"}) == "reward=rule,seed=0,steps=30"
    assert name_from_overrides(["logger=all"]) is None
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    task: ['seed=0,1', 'reward=rule,annotated', 'steps=3', 'model=tiny']\n"
        "  sweeper:\n    params:\n      model: tiny,small\n      lr: 1e-3,1e-4\n")
    # the command line wins over the preset's params: model is fixed, lr sweeps from the preset
    assert sweep_params(sweep) == {"lr": "1e-3,1e-4", "seed": "0,1", "reward": "rule,annotated"}
    (sweep / "multirun.yaml").write_text("hydra:\n  overrides:\n    task: ['seed=0,1', 'steps=3']\n")  # no preset
    assert sweep_params(sweep) == {"seed": "0,1"}

    job = {"mode": "MULTIRUN", "overrides": ["seed=0", "reward=rule", "x.text=a b"]}
    cmd = shell_command(["rlexp train", "-m", "seed=0,1", "reward=rule,annotated", "x.text=a b"], job)
    assert shlex.split(cmd) == ["rlexp", "train", "seed=0", "reward=rule", "x.text=a b"]  # the job's own run
    assert shell_command(["rlexp train", "seed=1"], {}) == "rlexp train seed=1"
    echo = subprocess.run(["bash", "-c", f"set -- {shell_command(['rlexp train', 'x=it' + chr(39) + 's'], {})}; "
                                         "printf '%s\\n' \"$@\""], capture_output=True, text=True, check=True)
    assert echo.stdout.splitlines() == ["rlexp", "train", "x=it's"]  # quoting survives a real shell

    n = numerics_info(torch_probe=True)
    assert n["cpu_model"] and n["cpu_flags"] and len(n["cpu_flags_sha256"]) == 64
    t = n["torch"]
    assert t["blas"] and t["threads"] >= 1 and t["cpu_capability"] and t["torch"].startswith("2.")
    assert set(n["gpu"]) >= {"count", "models", "cuda", "cudnn", "driver"}


def test_an_old_manifest_reads_typed_and_keeps_what_this_version_does_not_know(tmp_path: Path) -> None:
    """A manifest from before `schema` (and before `identity`) reads as version 1 with defaults; keys this
    version does not know (a plugin's record) survive a rewrite, in place after the known ones."""
    run = tmp_path / "old"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({
        "status": "running", "run_dir": str(run), "overrides": ["seed=1"], "plugin": {"name": "p", "v": 2},
        "git": {"repo": None, "commit": None, "dirty": None, "diff_file": None}}))
    m = read_manifest(run)
    assert isinstance(m, Manifest) and m.schema == 1 and m.overrides == ["seed=1"]
    assert m.identity.run_name is None and m.git.commit is None and m.extra == {"plugin": {"name": "p", "v": 2}}
    finish_manifest(run, "completed", {"eval/accuracy": 1})
    back = json.loads((run / "manifest.json").read_text())
    assert back["plugin"] == {"name": "p", "v": 2} and back["status"] == "completed"
    assert list(back).index("plugin") == list(back).index("artifacts") + 1


@pytest.mark.parametrize(("field", "value", "says"), [
    ("overrides", "seed=1", "`overrides` must be a list, got a string"),
    ("hydra", {"config_dir": 3}, "`hydra.config_dir` must be a string or absent, got an integer"),
    ("seeds", {"global": "7"}, "`seeds.global` must be an integer or absent, got a string"),
    ("artifacts", [{"path": "a", "bytes": True}], "`artifacts[0].bytes` must be an integer or absent, got a boolean"),
])
def test_a_mistyped_manifest_is_refused_naming_the_file_and_field(tmp_path: Path, field: str, value: object,
                                                                   says: str) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": 1, "status": "completed", field: value}))
    with pytest.raises(ManifestError) as e:
        read_manifest(tmp_path)
    assert str(e.value) == f"{tmp_path / 'manifest.json'}: {says}"


def test_a_manifest_that_is_not_a_json_object_is_refused(tmp_path: Path) -> None:
    for text, says in (("[1, 2]", "the top level must be an object, got a list"), ("{'a': 1", "not JSON")):
        (tmp_path / "manifest.json").write_text(text)
        with pytest.raises(ManifestError, match=str(tmp_path / "manifest.json")) as e:
            read_manifest(tmp_path)
        assert says in str(e.value)


def test_compare_reads_a_mistyped_manifest_as_absent_not_as_a_crash(tmp_path: Path) -> None:
    """`rlexp compare` over downloaded folders: a manifest whose `identity` is not an object is not trusted for
    the name, config or status; the metrics still load, under the folder's name."""
    from rlexp.tracking.runs import load_run_dir

    run = tmp_path / "r7"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"identity": "x", "status": "completed", "config": {"seed": 1}}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward/mean": 0.5}) + "\n")
    rec = load_run_dir(run)
    assert rec.name == "r7" and rec.status is None and rec.manifest == {}
    assert rec.series("reward/mean") == ([0.0], [0.5])
