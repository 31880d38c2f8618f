"""Hydra composition: every option of every group composes into the typed schema; bad input fails early."""
from __future__ import annotations

import subprocess
import uuid

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlexp.config.schema import register_configs
from rlexp.config.validate import ConfigError, validate
from tests.conftest import REPO, kill_tagged, tagged_env

CONF = REPO / "conf"
GROUPS = ["model", "environment", "reward", "verifier_set", "algorithm", "generator", "trainer", "sync", "cluster",
          "logger"]
register_configs()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes_into_the_schema(group: str, option: str) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[f"{group}={option}"])
    typed = OmegaConf.to_object(cfg)  # raises on a type mismatch anywhere
    assert getattr(typed, group) is not None
    if group == "model" and option != "tiny":  # brings a GPU cluster (conf/scale/); on CPU it is refused
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cpu = compose("train", overrides=[f"model={option}", "cluster=local", "generator=titan",
                                                   "trainer.micro_batch_size=1"])
        with pytest.raises(ConfigError, match="billion-parameter"):
            validate(OmegaConf.to_object(cpu))
        return
    if group in ("cluster",) and typed.cluster.device == "cuda":
        return  # needs a GPU to validate; composition is what is checked here
    if typed.trainer.micro_batch_size == 0:  # trainer=large: derived from the memory plan, as prepare does first
        from rlexp.cluster.planner import plan_memory

        typed.trainer.micro_batch_size = plan_memory(typed).micro_batch_size
    validate(typed)


def test_every_experiment_preset_composes() -> None:
    for option in options("experiment"):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=[f"experiment={option}"])
        OmegaConf.to_object(cfg)


def compose_error(*overrides: str) -> str:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"), pytest.raises(Exception) as e:
        cfg = compose("train", overrides=list(overrides))
        validate(OmegaConf.to_object(cfg))
    chain, err = [], e.value  # Hydra wraps the schema's message: the CLI prints the whole chain
    while err is not None:
        chain.append(str(err))
        err = err.__cause__
    return "\n".join(chain)


def test_misspelled_key_is_named() -> None:
    assert "trainer.lrr" in compose_error("trainer.lrr=0.1")


def test_wrong_type_is_named() -> None:
    msg = compose_error("trainer.lr=fast")
    assert "trainer.lr" in msg


def test_unknown_option_lists_the_choices() -> None:
    msg = compose_error("reward=best")
    assert "reward/best" in msg and "weaver" in msg and "single_rm" in msg


def test_bad_value_names_key_and_choices() -> None:
    msg = compose_error("sync.mode=sometimes")
    assert "sync.mode" in msg and "async" in msg


def test_group_size_one_is_refused() -> None:
    assert "group_size" in compose_error("algorithm.group_size=1")


@pytest.fixture(scope="module")
def cli() -> dict[str, subprocess.CompletedProcess]:
    """This file's four `rlexp train` commands, run in one child (tests/cli_batch.py): each
    keeps its own exit code and output; one interpreter start and torch import, not four."""
    from tests.cli_batch import rlexp_each

    commands = {"sometimes": ["train", "sync.mode=sometimes"], "help": ["train", "--help"],
                "job": ["train", "--cfg", "job", "reward=weaver"],
                "qwen3_8b": ["train", "model=qwen3_8b", "reward=weaver"]}  # it loads torch
    tag = uuid.uuid4().hex
    try:
        done = rlexp_each(list(commands.values()), env=tagged_env(tag), timeout=300)
    finally:
        kill_tagged(tag)
    return dict(zip(commands, done))


def test_cli_reports_errors_without_traceback_before_spawning(cli: dict) -> None:
    p = cli["sometimes"]
    assert p.returncode != 0
    assert "sync.mode=sometimes" in p.stderr and "expected one of [on_policy, async]" in p.stderr
    assert "Traceback" not in p.stderr and "actor graph" not in p.stdout


def test_qwen3_8b_weaver_composes_and_says_what_is_missing(cli: dict) -> None:
    p = cli["qwen3_8b"]
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert "cluster=gpu_node" in p.stderr  # how to provide what is missing


def test_help_lists_groups_and_cfg_job_prints_config(cli: dict) -> None:
    for name in ("help", "job"):
        assert cli[name].returncode == 0, cli[name].stderr
    h = cli["help"].stdout
    for g in GROUPS:
        assert f"{g}:" in h or f"{g}/" in h or g in h
    assert "weaver" in h and "qwen3_8b" in h
    job = cli["job"].stdout
    assert "name: weaver" in job and "group_size: 16" in job


@pytest.mark.parametrize("override,allowed", [
    ("generator.backend=vlm", "[titan, vllm]"), ("algorithm.loss_agg=mean", "token_mean"),
    ("determinism=strict", "[off, seeded, full]"), ("cluster.device=tpu", "[cpu, cuda]"),
    ("model.dtype=fp8", "bfloat16"), ("trainer.lr_schedule=step", "[constant, linear, cosine]"),
    ("logger.wandb.mode=cloud", "offline"),  # cluster.transport: checked in prepare (tests/test_transport.py)
])
def test_allowed_values_come_from_the_schema(override: str, allowed: str) -> None:
    msg = compose_error(override)
    assert override.split("=")[0] in msg and allowed in msg


def _schema_defaults_repeated(group: str, option: str) -> list[str]:
    """Keys of a group option's YAML whose value is already the schema default (the option's own
    selector -- its name, backend or mode -- may be restated)."""
    from rlexp.config.schema import TrainConfig

    base = OmegaConf.structured(TrainConfig)[group]
    found: list[str] = []

    def walk(node: object, d: dict, parent: dict, prefix: str) -> None:
        for k, v in d.items():
            if k == "defaults" or not OmegaConf.is_dict(node) or k not in node:
                continue
            if isinstance(v, dict) and v:
                walk(node[k], v, parent.get(k) or {}, f"{prefix}{k}.")
                continue
            default = OmegaConf.to_container(node, resolve=False)[k]
            overrides_parent = k in parent and parent[k] != v  # a parent option set it otherwise
            if default == v and not overrides_parent and not (prefix == "" and k in ("name", "backend", "mode")):
                found.append(f"{prefix}{k}")

    own = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml")) or {}
    parent: dict = {}
    for entry in own.get("defaults", []):  # options this one extends, e.g. `- slurm` in its defaults list
        if isinstance(entry, str) and entry != "_self_" and (CONF / group / f"{entry}.yaml").is_file():
            parent.update(OmegaConf.to_container(OmegaConf.load(CONF / group / f"{entry}.yaml")) or {})
    walk(base, own, parent, "")
    return found


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_yaml_holds_only_what_the_option_changes(group: str, option: str) -> None:
    assert _schema_defaults_repeated(group, option) == [], "restates schema defaults; delete them from the YAML"


def test_derived_values_are_computed_once() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        on = OmegaConf.to_object(compose("train"))
        asy = OmegaConf.to_object(compose("train", overrides=["sync=async", "sync.max_policy_age=3"]))
        vl = OmegaConf.to_object(compose("train", overrides=["generator=vllm", "model.parallelism.generator_tp=2",
                                                              "model.parallelism.generator_replicas=3"]))
    assert on.sync.max_policy_age == 1 and on.sync.policy_age == 0  # on-policy: never stale, whatever the knob
    assert asy.sync.policy_age == 3
    assert (vl.generator.replicas, vl.generator.tp, vl.generator.gpus_per_replica) == (3, 2, 2)
    assert on.generator.gpus_per_replica == 1 and on.model.parallelism.trainer_world == 1
