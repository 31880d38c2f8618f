"""The trust boundary's classification (rlexp.config.trust, rlexp.config.overrides): every key of the schema says what
its value can do, and a value from a file someone else wrote passes only when it is plain data, judged as Hydra
parses it. Pure logic, no processes: the end-to-end hostile cases are tests/test_hostile_fuzz.py."""
from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from rlexp.config.overrides import OverrideError, check_overrides, refusals
from rlexp.config.schema import TrainConfig
from rlexp.config.trust import TRUST, Trust, option_kind, passes
from rlexp.tracking import reproduce
from rlexp.tracking.manifest import Manifest


def _leaves(tp: Any, path: str = "") -> list[tuple[str, Any, dict]]:
    """(key, type, field metadata) of every field reached from `tp`, dataclasses walked into (lists of them too)."""
    out = []
    for f in dataclasses.fields(tp):
        hint = typing.get_type_hints(tp)[f.name]
        key = f"{path}{f.name}"
        inner = _unwrap(hint)
        if typing.get_origin(inner) is list and dataclasses.is_dataclass(typing.get_args(inner)[0]):
            inner = typing.get_args(inner)[0]
        if dataclasses.is_dataclass(inner):
            out += _leaves(inner, key + ".")
        else:
            out.append((key, hint, dict(f.metadata)))
    return out


def _unwrap(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _plain(tp: Any) -> bool:
    """int, float, bool or an enum, or a list of them: data by its type alone."""
    tp = _unwrap(tp)
    if typing.get_origin(tp) is list:
        return _plain(typing.get_args(tp)[0])
    return isinstance(tp, type) and (issubclass(tp, (int, float, bool)) or issubclass(tp, enum.Enum))


def test_every_schema_key_says_what_its_value_can_do() -> None:
    """A new str/list/dict key must be classified where it is declared: a path, URL or class name cannot slip
    through as data because nobody thought about it."""
    leaves = _leaves(TrainConfig)
    assert len(leaves) > 80
    missing = [k for k, tp, meta in leaves if TRUST not in meta and not _plain(tp)]
    assert missing == [], f"declare metadata=CODE/LOCATION/ENDPOINT/DATA/OPTIONS for {missing}"
    for _, _, meta in leaves:
        if TRUST in meta:
            Trust(meta[TRUST])  # a known kind
    kinds = {k: Trust(meta[TRUST]) for k, _, meta in leaves if TRUST in meta}
    for key in ("environment.name", "reward.name", "algorithm.loss", "cluster.job", "cluster.transport", "plugins",
                "config_path"):
        assert kinds[key] == Trust.CODE, key
    for key in ("cluster.shm_dir", "model.path", "logger.runs_root", "resume", "environment.dataset"):
        assert kinds[key] == Trust.LOCATION, key
    for key in ("logger.mlflow.tracking_uri", "logger.wandb.entity"):
        assert kinds[key] == Trust.ENDPOINT, key
    # By name: every key whose name says path/dir/root/url/uri is not data.
    for k, _, meta in leaves:
        if k.rsplit(".", 1)[-1].endswith(("_dir", "path", "root", "url", "uri")):
            assert meta.get(TRUST) not in (None, Trust.DATA), k


def test_a_backends_settings_keep_their_declared_trust_as_job_options() -> None:
    """The built-in backends' `Settings` (their `cluster.job_options`) declare each field's trust as
    the schema's fields do; in a manifest's overrides a free-form key is judged by its name
    (`rlexp.config.trust.option_kind`), which must be as strict: every field declared code, a
    location or an endpoint is refused when set, and one that runs (`RUNS`: an interpreter, an
    image, scheduler arguments) whatever its value."""
    from rlexp.cluster.registry import job_backend
    from rlexp.config.trust import ALWAYS

    for name in ("slurm", "kubernetes"):
        for f in dataclasses.fields(job_backend(name).Settings):
            kind = f.metadata.get(TRUST)
            if kind in (None, Trust.DATA):
                continue
            for value in ("x", "/x", "http://h") if f.metadata.get(ALWAYS) else ("/x", "http://h"):
                assert refusals(["cluster", "job_options", f.name], value), (name, f.name, value)


@pytest.mark.parametrize("override", [
    "environment.name=evilmod:Env", "environment.name='evilmod2:Env'", 'environment.name="evilmod2:Env"',
    "environment.name='evilmod2 : Env'", "environment.name=${environment.split}", "reward.name=pkg.mod:R",
    "algorithm.loss=x.y:Loss", "environment.options={rule: 'm:Rule'}", "environment.options.rule=m:Rule",
    "cluster.job=m:Job", "cluster.transport='m:T'", "plugins=[evilmod]", "config_path=[/tmp]",
    "cluster.job_options.python_exe=/tmp/evil/python", "cluster.job_options.python_exe=python3",
    "cluster.job_options.extra_args=['--wrap=rm -rf ~']", "cluster.job_options.image=evil",
    "cluster.job_options.log_dir=/home/u", "cluster.job_options.port=22",
    "logger.mlflow.tracking_uri=http://127.0.0.1:9", "logger.mlflow.tracking_uri='http://h:1/'",
    "logger.wandb.entity=someone_else", "cluster.job_options.kubeconfig=/home/u/.kube/config",
    "cluster.shm_dir=/some/folder", "cluster.shm_dir='/some/folder'", "model.path=/data/m", "logger.runs_root=/x",
    "resume=/elsewhere/checkpoints/step_000010", "environment.dataset=/etc/secret.jsonl",
    "environment.dataset=data/x.jsonl", "reward.options.base_url=http://h", "reward.options.anything=http://h",
    "reward.verifiers=[{name: v, kind: reward_model, options: {path: /models/rm}}]",
    "cluster.transport_options={shm: {root: /tmp}}", "environment.options.x=pkg.mod:Cls",
    "environment.options.y=/abs/file", "eval.benchmarks=[../../evil]",
    "verifier_set.members=[{name: v, kind: 'evilmod:Kind'}]",
    "logger.trackers=[{name: 'evilmod:Tracker'}]",
    "cluster.job_options={script: /tmp/evil.sh}",
])
def test_a_manifest_override_that_names_code_a_place_or_an_endpoint_is_refused(override: str) -> None:
    with pytest.raises(OverrideError, match=r"manifest\.json overrides: refusing override") as e:
        check_overrides([override], "manifest.json overrides")
    key = override.split("=", 1)[0]
    assert key in str(e.value) and "command line" in str(e.value)


@pytest.mark.parametrize("override", [
    "seed=3", "steps=6", "environment.name=arithmetic", "environment.name='arithmetic'", "reward.name=rule",
    "algorithm.loss=grpo", "cluster.job=process", "cluster.transport=shm", "environment.options.rule=sort",
    "environment.options={max_operand: 20}", "environment.dataset=openai/gsm8k", "model.hf_repo=Qwen/Qwen3-8B",
    "resume=auto", "resume=never", "logger.wandb.project=mine", "tags=[a,b]", "+extra.note='x:y /z http://q'",
    "~cluster.shm_dir", "eval.benchmarks=[gsm8k]", "trainer.lr=1e-3", "logger.mlflow.tracking_uri=null",
    "algorithm.max_tokens=${eval.max_tokens}", "verifier_set.members=[{name: v, kind: majority}]",
    "logger.trackers=[{name: csv, options: {prefix: reward}}]", "cluster.job_options={queue: gpu}",
])
def test_plain_data_passes(override: str) -> None:
    assert check_overrides([override], "m") == [override]


def test_code_passes_only_with_trust_and_never_a_place_or_endpoint() -> None:
    assert check_overrides(["environment.name=mytask.tasks:CountA", "plugins=[mytask.tasks]"], "m",
                           allow_code=True)
    with pytest.raises(OverrideError, match=r"cluster\.shm_dir"):
        check_overrides(["cluster.shm_dir=/x"], "m", allow_code=True)
    with pytest.raises(OverrideError) as e:  # every refused override named at once
        check_overrides(["cluster.shm_dir=/x", "seed=1", "logger.mlflow.tracking_uri=http://h"], "m")
    assert "cluster.shm_dir" in str(e.value) and "tracking_uri" in str(e.value) and "seed" not in str(e.value)


def test_free_form_options_are_judged_by_name_and_shape() -> None:
    assert option_kind("rule", "sort") == Trust.CODE and passes(Trust.CODE, "sort")
    assert not passes(Trust.CODE, "a.b:C") and not passes(Trust.CODE, "../x") and not passes(Trust.CODE, "a.b")
    assert option_kind("cache_dir", "x") == Trust.LOCATION and option_kind("note", "/etc/passwd") == Trust.LOCATION
    assert option_kind("note", "https://x") == Trust.ENDPOINT and option_kind("operands", 3) == Trust.DATA
    assert refusals(["environment"], {"name": "arithmetic", "options": {"max_operand": 9}}) == []
    bad = refusals(["environment"], {"name": "evilmod:Env", "_target_": "os.system", "dataset": "/x.jsonl"})
    assert {k for k, _, _ in bad} == {"environment.name", "environment._target_", "environment.dataset"}


def _manifest(run: Path, overrides: list[str], config: dict | None = None) -> Manifest:
    return Manifest.from_dict({"overrides": overrides, "config": config or {}, "hydra": {"runtime_cwd": str(run)}})


def test_reproduce_command_takes_only_data_and_the_users_own_values(tmp_path: Path) -> None:
    """Finding 2 (quoting), 3 (tracking_uri) and 4 (shm_dir) at the command builder; what the user types after
    `--` replaces the manifest's value and is not judged."""
    for o in ["environment.name='evilmod2:Env'", "logger.mlflow.tracking_uri=http://127.0.0.1:9",
              "cluster.shm_dir=/some/folder"]:
        with pytest.raises(OverrideError, match="refusing override"):
            reproduce.build_command(_manifest(tmp_path, ["seed=1", o]), tmp_path / "new")
        cmd = reproduce.build_command(_manifest(tmp_path, ["seed=1", o]), tmp_path / "new",
                                      extra=[o.split("=", 1)[0] + "=mine"])
        assert o not in cmd and "seed=1" in cmd


def test_reproduce_starts_in_this_folder_without_trust(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The manifest's `hydra.runtime_cwd` (which a plug-in run searched for modules) is used only with trust."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"overrides": ["seed=1"], "hydra": {"runtime_cwd": str(run)}}))
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    seen: list[Any] = []
    reproduce.main([str(run)], runner=lambda c, cwd=None: seen.append(cwd) or 1)
    capsys.readouterr()
    reproduce.main([str(run), "trust_plugins=true"], runner=lambda c, cwd=None: seen.append(cwd) or 1)
    assert seen == [None, str(run)]
    # the old spelling (once `rlexp eval`'s) still works, and says which one to use
    assert "trust_plugins=true is the old spelling; use --trust-plugins" in capsys.readouterr().err


def test_weights_cleanup_deletes_only_folders_rlexp_made(tmp_path: Path) -> None:
    """Finding 4's second half: whatever `cluster.shm_dir` names (a user's own choice included), cleanup deletes
    only run folders the shm transport made (its marker, this user's, no link), never a folder's other contents,
    even one whose name ends in a pid no process has."""
    from rlexp.config.schema import TrainConfig
    from rlexp.run.launcher import release_stale_weights, release_weights
    from rlexp.transport import TransportError
    from rlexp.transport.shm import ShmTransport, owned

    root = tmp_path / "shm"
    (root / "photos-3999999").mkdir(parents=True)
    (root / "photos-3999999" / "a.jpg").write_text("x")
    (root / "link-3999998").symlink_to(root / "photos-3999999")
    t = ShmTransport("crashed-3999997", root=root)  # a run of ours that died without tearing down
    assert owned(t.dir) and not owned(root / "photos-3999999") and not owned(root / "link-3999998")
    c = TrainConfig()
    c.cluster.shm_dir = str(root)
    release_stale_weights(c.cluster)
    release_weights(c.cluster, "photos-3999999")
    assert not t.dir.exists()
    assert (root / "photos-3999999" / "a.jpg").read_text() == "x" and (root / "link-3999998").is_symlink()
    (root / "theirs-5").mkdir()  # a folder of the name a run would take, not made by rlexp: refused, kept
    with pytest.raises(TransportError, match=r"not made by rlexp"):
        ShmTransport("theirs-5", root=root)
    assert (root / "theirs-5").is_dir()
