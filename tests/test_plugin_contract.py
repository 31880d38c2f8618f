"""One plug-in contract (issue 44 item 1, docs/plugins.md): every extension point is a `Registry`
entry, found by name or by import path the same way from rlexp and from a user's module, with its
declarations read by the code that uses it. Fast: real modules written to a temporary folder and
imported, no run (the runs are in tests/test_plugin_examples.py)."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest

from rlexp import registry as reg
from rlexp.config.reward import VerifierConfig
from rlexp.config.schema import ClusterConfig, TrainConfig
from rlexp.config.validate import ConfigError
from rlexp.registry import PluginError, Registry
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def _forget_imports():
    """A lookup records the user's modules for the manifest, and a user's module registers names:
    keep this test's out of the next one's (other tests list the registered choices)."""
    import rlexp.envs.registry
    import rlexp.rewards.registry
    import rlexp.tracking.registry
    import rlexp.transport.registry  # noqa: F401  (the built-ins registered before the snapshot)
    from rlexp.cluster.registry import JOBS
    from rlexp.envs.base import ENVIRONMENTS
    from rlexp.rewards.base import REWARDS
    from rlexp.rewards.verifiers.kinds import VERIFIER_KINDS
    from rlexp.tracking.base import TRACKERS
    from rlexp.transport.base import TRANSPORTS

    registries = [JOBS, ENVIRONMENTS, REWARDS, VERIFIER_KINDS, TRACKERS, TRANSPORTS]
    entries = [dict(r._classes) for r in registries]
    imported, by_name = dict(reg.IMPORTED), dict(reg.BY_NAME)
    yield
    for r, e in zip(registries, entries):
        r._classes.clear()
        r._classes.update(e)
    reg.IMPORTED.clear()
    reg.IMPORTED.update(imported)
    reg.BY_NAME.clear()
    reg.BY_NAME.update(by_name)


def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    """A module of a user's own, on the path (what `plugins` / `config_path` do in a run)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


# --- the Registry itself ----------------------------------------------------------------------
class Thing:
    name = ""


def test_registry_by_name_by_path_close_matches_and_duplicates() -> None:
    things: Registry[type[Thing]] = Registry("thing", Thing, "a Thing subclass")

    @things.register("alpha")
    class Alpha(Thing):
        pass

    assert things.get("alpha") is Alpha and Alpha.name == "alpha" and things.names() == ["alpha"]
    with pytest.raises(
        PluginError,
        match=r"unknown thing 'alpah'; did you mean 'alpha'\? choose one of \['alpha'\], "
        r"or name your own class as package.module:Class \(a Thing subclass\) or "
        r"register it by name in a module listed in `plugins`",
    ):
        things.get("alpah")
    with pytest.raises(
        PluginError, match=r"unknown thing 'zzz'; choose one of"
    ):  # nothing close: no guess
        things.get("zzz")
    things.register("alpha")(Alpha)  # the same class again (a module imported twice) is fine

    class Other(Thing):
        pass

    with pytest.raises(
        PluginError,
        match=r"thing name 'alpha' is already registered by .*Alpha; register "
        r".*Other under another name",
    ):
        things.register("alpha")(Other)
    assert things.get("alpha") is Alpha  # the first keeps its name


def test_registry_by_import_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlexp.rewards.verifiers.base import Rule

    mod = user_module(
        tmp_path,
        monkeypatch,
        "contract_things",
        """
        from rlexp.rewards.verifiers.base import Rule
        class Mine(Rule):
            pass
        NOT_A_CLASS = 3
        """,
    )
    things: Registry[type[Rule]] = Registry("thing", Rule, "hint")
    cls = things.get(f"{mod}:Mine")
    assert cls.__name__ == "Mine" and mod in reg.IMPORTED and mod not in reg.BY_NAME
    with pytest.raises(
        PluginError, match=r"thing contract_things:Nope: module 'contract_things' has no attribute"
    ):
        things.get(f"{mod}:Nope")
    with pytest.raises(
        PluginError, match=r"NOT_A_CLASS is 3, not a subclass of rlexp.rewards.verifiers.base.Rule"
    ):
        things.get(f"{mod}:NOT_A_CLASS")
    with pytest.raises(PluginError, match=r"cannot import module 'no_such_mod'"):
        things.get("no_such_mod:X")
    strict: Registry[type[Rule]] = Registry("thing", Rule, "decorate it", registered_only=True)
    with pytest.raises(
        PluginError, match=r"thing contract_things:Mine: Mine is not registered; decorate it"
    ):
        strict.get(f"{mod}:Mine")


def test_having_lists_the_entries_that_declare_a_capability() -> None:
    from rlexp.rewards.verifiers.kinds import VERIFIER_KINDS
    from rlexp.rewards.weaver import SEPARABLE_KINDS
    from rlexp.transport.base import TRANSPORTS

    assert {"reward_model", "lm_judge"} <= set(VERIFIER_KINDS.having("model"))
    assert "rule" not in VERIFIER_KINDS.having("generic")
    assert set(SEPARABLE_KINDS) == {"format", "majority"}  # Weaver reads the kinds' declarations
    assert "shm" in TRANSPORTS.having("leaves_files") and "tcp" not in TRANSPORTS.having(
        "leaves_files"
    )


# --- each extension point, registered from outside ---------------------------------------------
def test_an_environment_and_a_reward_from_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlexp.envs.base import ENVIRONMENTS
    from rlexp.rewards.base import REWARDS
    from rlexp.rewards.registry import reward_class  # the built-ins, registered

    mod = user_module(
        tmp_path,
        monkeypatch,
        "contract_task",
        """
        from rlexp.envs.arithmetic import Arithmetic
        from rlexp.envs.base import register_env
        from rlexp.rewards.base import Reward, register_reward

        @register_env("contract_env")
        class ContractEnv(Arithmetic):
            pass

        @register_reward("contract_judged")
        class Judged(Reward):
            needs_gold = False  # label-free: by default it scores with every member

        @register_reward("contract_picky")
        class Picky(Reward):
            needs_gold = False
            @classmethod
            def chosen_verifiers(cls, options, members):
                return [m for m in members if m.name == options["only"]]
        """,
    )
    __import__(mod)
    assert ENVIRONMENTS.get("contract_env") is ENVIRONMENTS.get(f"{mod}:ContractEnv")
    members = [VerifierConfig(name="a", kind="format"), VerifierConfig(name="b", kind="majority")]
    assert REWARDS.get("contract_judged").chosen_verifiers({}, members) == members
    assert REWARDS.get(f"{mod}:Picky").chosen_verifiers({"only": "b"}, members) == members[1:]
    assert (
        reward_class("rule").chosen_verifiers({}, members) == []
    )  # reads gold: no verifiers served


def test_single_rm_declares_the_one_verifier_it_picks() -> None:
    from rlexp.rewards.registry import reward_class

    members = [
        VerifierConfig(name="j", kind="lm_judge"),
        VerifierConfig(name="rm", kind="reward_model"),
    ]
    single = reward_class("single_rm")
    assert single.chosen_verifiers({}, members) == members[1:]
    assert single.chosen_verifiers({"verifier": "j"}, members) == members[:1]
    with pytest.raises(
        ValueError, match=r"options.verifier='x' is not in the verifier set \['j', 'rm'\]"
    ):
        single.chosen_verifiers({"verifier": "x"}, members)
    inline = single.chosen_verifiers(
        {"kind": "rule", "rule": "arithmetic_mod5", "transform": "raw"}, []
    )
    assert inline == [VerifierConfig(name="", kind="rule", options={"rule": "arithmetic_mod5"})]


KIND_MODULE = """
    from dataclasses import dataclass
    import numpy as np
    from rlexp.rewards.verifiers.base import Verifier
    from rlexp.rewards.verifiers.kinds import VerifierKind, register_verifier_kind

    @dataclass
    class LenOptions:
        limit: int = 3

    class LenVerifier(Verifier):
        def __init__(self, name, limit):
            super().__init__(name)
            self.limit = limit
        def score(self, problems, texts):
            return np.array([float(len(t) <= self.limit) for t in texts])

    @register_verifier_kind("contract_len")
    class LenKind(VerifierKind):
        Options = LenOptions
        @classmethod
        def build(cls, name, options, env, device):
            return LenVerifier(name, options.limit)

    @register_verifier_kind("contract_task_only")
    class TaskOnly(LenKind):
        generic = False

    @register_verifier_kind("contract_model")
    class ModelKind(LenKind):
        model = True
    """


def test_a_verifier_kind_from_outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlexp.envs.arithmetic import Arithmetic
    from rlexp.rewards.verifiers.kinds import is_served, supported_kinds, supports
    from rlexp.rewards.verifiers.registry import build_verifier

    mod = user_module(tmp_path, monkeypatch, "contract_kinds", KIND_MODULE)
    __import__(mod)
    by_name = build_verifier(
        {"name": "short", "kind": "contract_len", "options": {"limit": 2, "threshold": 0.5}}
    )
    by_path = build_verifier({"name": "short", "kind": f"{mod}:LenKind"})
    assert (
        list(by_name.score([], ["ab", "abc"])) == [1.0, 0.0] and by_path.limit == 3
    )  # typed, defaulted
    with pytest.raises(
        ConfigError,
        match=r"verifier 'short' \(kind contract_len\): unknown option 'limt'; did you "
        r"mean limit\?",
    ):
        build_verifier({"name": "short", "kind": "contract_len", "options": {"limt": 2}})
    assert supports(Arithmetic, VerifierConfig(kind="contract_len"))  # generic: any environment
    assert not supports(Arithmetic, VerifierConfig(kind="contract_task_only"))
    assert "contract_len" in supported_kinds(Arithmetic) and "rule" in supported_kinds(Arithmetic)
    assert is_served(
        VerifierConfig(kind="contract_model")
    )  # a model: a service of its own, counted by the plan
    assert not is_served(VerifierConfig(kind="contract_model", options={"policy": True}))
    with pytest.raises(
        PluginError, match=r"unknown verifier kind 'contract_lne'; did you mean 'contract_len'"
    ):
        build_verifier({"name": "x", "kind": "contract_lne"})


TRANSPORT_MODULE = """
    from rlexp.transport.base import WeightTransport, register_transport
    CALLS = []

    @register_transport("contract_files")
    class Files(WeightTransport):
        leaves_files = True
        def __init__(self, run_name, *, keep=2, root="/nowhere"):
            pass
        @classmethod
        def settings(cls, cfg):
            return {"root": "/from-settings"}
        @classmethod
        def release_stale(cls, settings):
            CALLS.append(("stale", settings["root"]))
        @classmethod
        def release(cls, settings, run_name):
            CALLS.append(("release", settings["root"], run_name))
        def publish(self, version, sd):
            return ""
        def fetch(self, location):
            return {}

    class Unregistered(Files):
        pass
    """


def test_a_transport_from_outside_declares_its_set_up_and_clean_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher's set-up and clean-up call whatever the run's transport declares
    (rlexp.run.launcher names no transport)."""
    from rlexp.run.launcher import release_stale_weights, release_weights
    from rlexp.transport import TransportError
    from rlexp.transport.registry import resolve

    mod = user_module(tmp_path, monkeypatch, "contract_transport", TRANSPORT_MODULE)
    user = __import__(mod)
    assert resolve("contract_files") is resolve(f"{mod}:Files")
    with pytest.raises(TransportError, match=r"Unregistered is not registered; decorate it"):
        resolve(f"{mod}:Unregistered")  # the generators rebuild a transport by its registered name
    c = TrainConfig()
    c.cluster.transport = f"{mod}:Files"
    release_stale_weights(c.cluster)
    release_weights(c.cluster, "run-1")
    assert user.CALLS == [("stale", "/from-settings"), ("release", "/from-settings", "run-1")]


JOB_MODULE = """
    from dataclasses import dataclass
    from rlexp.cluster.registry import JobBackend, register_job

    @dataclass
    class QueueSettings:
        queue: str = "default"
        max_hours: int = 4

    @register_job("contract_queue")
    class Queue(JobBackend):
        monarch_job = "LocalJob"
        own_hosts = False
        one_machine = True
        Settings = QueueSettings
        @classmethod
        def check(cls, c):
            if cls.settings(c).max_hours > 24:
                raise ValueError("cluster.job_options.max_hours: at most 24")
    """


def test_a_cluster_backend_from_outside_has_its_settings_dataclass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlexp.cluster.hosts import check_cluster
    from rlexp.cluster.registry import job_backend

    mod = user_module(tmp_path, monkeypatch, "contract_job", JOB_MODULE)
    __import__(mod)
    c = ClusterConfig(job="contract_queue", job_options={"queue": "gpu"})
    check_cluster(c)
    assert (
        job_backend(f"{mod}:Queue").settings(c).queue == "gpu"
        and job_backend(c.job).settings(c).max_hours == 4
    )
    with pytest.raises(ConfigError, match=r"unknown option 'queu'; did you mean queue\?"):
        check_cluster(ClusterConfig(job="contract_queue", job_options={"queu": "gpu"}))
    with pytest.raises(ConfigError, match=r"options.max_hours='x' must be of type int"):
        check_cluster(ClusterConfig(job="contract_queue", job_options={"max_hours": "x"}))
    with pytest.raises(ValueError, match="at most 24"):
        check_cluster(ClusterConfig(job="contract_queue", job_options={"max_hours": 48}))
    with pytest.raises(ValueError, match=r"cluster.job=local takes no options; remove them"):
        check_cluster(ClusterConfig(job="local", job_options={"queue": "gpu"}))


def test_a_tracker_from_outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlexp.tracking.registry import configured_trackers
    from rlexp.tracking.wandb_tracker import WandbTracker

    monkeypatch.syspath_prepend(str(REPO / "examples" / "my_tracker"))
    import csv_tracker

    logger = {
        "trackers": [
            {"name": "csv_tracker:CsvTracker", "options": {"prefix": "reward/"}},
            {"name": "csv"},
        ]
    }
    by_path, by_name = configured_trackers(logger)
    assert type(by_path) is type(by_name) is csv_tracker.CsvTracker
    assert by_path.options.prefix == "reward/" and by_name.options.prefix == ""
    with pytest.raises(
        ConfigError,
        match=r"logger.trackers\[0\] \(csv\): unknown option 'prefx'; did you mean "
        r"prefix\?",
    ):
        configured_trackers({"trackers": [{"name": "csv", "options": {"prefx": "r"}}]})
    with pytest.raises(PluginError, match=r"unknown tracker 'csvv'; did you mean 'csv'"):
        configured_trackers({"trackers": [{"name": "csvv"}]})
    built_in = configured_trackers(
        {"wandb": {"enabled": True, "project": "p"}, "mlflow": {"enabled": False}}
    )
    assert [type(t) for t in built_in] == [WandbTracker] and built_in[0].project == "p"


# --- orchestration names no built-in plug-in ---------------------------------------------------
def test_orchestration_code_names_no_built_in_plugin() -> None:
    """rlexp/run/* asks the registries' declarations; a string literal that is a built-in transport,
    job kind, tracker, reward or model verifier kind there would be a branch on one plug-in."""
    import rlexp.cluster.hosts
    import rlexp.tracking.registry
    import rlexp.transport.registry  # noqa: F401  (registers the transports)
    from rlexp.cluster.registry import JOBS
    from rlexp.rewards.registry import reward_names
    from rlexp.tracking.base import TRACKERS
    from rlexp.transport.base import TRANSPORTS

    names = {
        *TRANSPORTS.names(),
        *JOBS.names(),
        *TRACKERS.names(),
        *reward_names(),
        "reward_model",
        "lm_judge",
    }
    assert {"shm", "monarch", "local", "slurm", "wandb", "mlflow", "weaver"} <= names
    found = []
    for path in sorted((REPO / "rlexp" / "run").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert found == []
