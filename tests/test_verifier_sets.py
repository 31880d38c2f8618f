"""Verifier sets (conf/verifier_set/): every set composes into the schema and names a checkpoint for each
model verifier; `rlexp plan` counts the verifiers' GPUs; `rlexp train` stops before spawning when a verifier
checkpoint is missing or a verifier cannot score the environment."""
from __future__ import annotations

import copy
import functools
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlexp.cluster.layout import assign_gpus, gpus_needed, reward_verifiers
from rlexp.cluster.planner import plan_memory
from rlexp.config.schema import TrainConfig, register_configs
from rlexp.config.typed import typed_config
from tests.conftest import REPO, kill_tagged, tagged_env

CONF = REPO / "conf"
SETS = sorted(p.stem for p in (CONF / "verifier_set").glob("*.yaml"))
# The sets made for the real tasks: public checkpoints, pinned, sized, on GPU.
TASK_SETS = ["gpqa", "gsm8k", "math", "mmlu_pro"]
MC_SETS = {"gpqa", "mmlu_pro"}
MODEL_KINDS = {"reward_model", "lm_judge"}
GPQA_FIXTURE = REPO / "tests" / "fixtures" / "gpqa_diamond.csv"
HEX40 = re.compile(r"[0-9a-f]{40}")
register_configs()


@functools.cache
def _composed(overrides: tuple[str, ...]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=list(overrides))


def composed(*overrides: str):
    """`train` composed with `overrides`, once per distinct list in this file (a composition costs
    ~0.1 s and several tests read the same set); each call gets its own copy to change."""
    return copy.deepcopy(_composed(overrides))


def typed(*overrides: str) -> TrainConfig:
    return typed_config(composed(*overrides))


def served(members) -> list:
    return [m for m in members if str(m.kind) in MODEL_KINDS and not m.options.get("policy", False)]


def run(*args: str, tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """`rlexp ...` as a user runs it, with an empty Hugging Face cache (nothing is downloaded: offline)."""
    tag = uuid.uuid4().hex
    env = tagged_env(tag)
    env.update(HF_HUB_CACHE=str(tmp_path / "hf_cache"), HF_HUB_OFFLINE="1")
    try:
        return subprocess.run([sys.executable, "-m", "rlexp", *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=timeout)
    finally:
        kill_tagged(tag)


def test_task_sets_exist() -> None:
    assert set(TASK_SETS) <= set(SETS)


@pytest.mark.parametrize("name", SETS)
def test_every_verifier_set_composes_and_names_its_checkpoints(name: str) -> None:
    typed = OmegaConf.to_object(composed(f"verifier_set={name}"))  # raises on a schema mismatch
    vs = typed.verifier_set
    assert vs.name == name and vs.members
    names = [m.name for m in vs.members]
    assert len(set(names)) == len(names), f"verifier names repeat in {name}: {names}"
    for m in served(vs.members):
        o = m.options
        assert (o.get("hf_repo") and o.get("revision")) or o.get("path") or o.get("tiny"), \
            f"verifier_set={name}: model verifier {m.name!r} needs hf_repo + revision, path or tiny"
        assert m.replicas >= 1


@pytest.mark.parametrize("name", TASK_SETS)
def test_task_sets_are_pinned_sized_and_complete(name: str) -> None:
    from rlexp.rewards.verifiers.lm_judge import JudgeOptions
    from rlexp.rewards.verifiers.reward_model import RewardModelOptions

    vs = OmegaConf.to_object(composed(f"verifier_set={name}")).verifier_set
    kinds = [str(m.kind) for m in vs.members]
    assert {"reward_model", "lm_judge", "majority", "format"} <= set(kinds)
    assert kinds.index("reward_model") == 0  # the first reward model is single_rm's "single reward model"
    for m in served(vs.members):
        o = dict(m.options)
        assert o.get("hf_repo"), f"{name}/{m.name}: public checkpoint expected"
        rev = str(o.get("revision"))
        # Either pinned, or explicitly left on main with the reason in a YAML comment.
        assert HEX40.fullmatch(rev) or rev == "main", f"{name}/{m.name}: revision {rev!r}"
        if rev == "main":
            assert "unpinned" in (CONF / "verifier_set" / f"{name}.yaml").read_text()
        assert m.memory_gb > 0, f"{name}/{m.name}: memory_gb sizes its GPU"
        rest = {k: v for k, v in o.items() if k not in ("hf_repo", "revision", "threshold")}
        if str(m.kind) == "lm_judge":
            assert JudgeOptions(**rest).backend == "vllm"  # GPU judges; unknown options would raise here
        else:
            RewardModelOptions(**rest)


def test_qwen_judges_use_the_catalog_revisions() -> None:
    from rlexp.models.catalog import REVISIONS

    for name in TASK_SETS:
        for m in served(OmegaConf.to_object(composed(f"verifier_set={name}")).verifier_set.members):
            if m.options["hf_repo"] in REVISIONS:
                assert m.options["revision"] == REVISIONS[m.options["hf_repo"]], f"{name}/{m.name}"


@pytest.mark.parametrize("env", TASK_SETS)
def test_the_environment_selects_its_set(env: str) -> None:
    assert composed(f"environment={env}").verifier_set.name == env


@pytest.mark.parametrize("name", sorted(MC_SETS))
def test_multiple_choice_judges_get_the_multiple_choice_template(name: str) -> None:
    from rlexp.config.environment import EnvConfig
    from rlexp.envs.registry import build_env
    from rlexp.rewards.verifiers.lm_judge import TEMPLATES, LMJudgeVerifier

    env = build_env(EnvConfig(name="gpqa", dataset=str(GPQA_FIXTURE), split="test"))
    assert env.answer_format == "multiple_choice"
    judges = [m for m in OmegaConf.to_object(composed(f"verifier_set={name}")).verifier_set.members
              if str(m.kind) == "lm_judge"]
    assert judges
    for m in judges:
        opts = {k: v for k, v in m.options.items() if k not in ("hf_repo", "revision", "threshold")}
        assert LMJudgeVerifier(m.name, opts, env.answer_format).template == TEMPLATES["multiple_choice"]


# ----------------------------------------------------------------------------------------------------
# Which verifiers a reward serves, and where they run
# ----------------------------------------------------------------------------------------------------


def test_served_verifiers_follow_the_reward() -> None:
    members = served(OmegaConf.to_object(composed("verifier_set=math")).verifier_set.members)
    for reward in ("weaver", "verifier_mean", "verifier_vote"):
        cfg = typed("experiment=qwen3_8b_math", f"reward={reward}")
        assert [v.name for v in reward_verifiers(cfg.reward, cfg.verifier_set)] == [m.name for m in members]
    first_rm = next(m.name for m in members if str(m.kind) == "reward_model")
    single = typed("experiment=qwen3_8b_math", "reward=single_rm")
    assert [v.name for v in reward_verifiers(single.reward, single.verifier_set)] == [first_rm]
    picked = typed("experiment=qwen3_8b_math", "reward=single_rm", "+reward.options.verifier=judge_qwen3_8b")
    assert [v.name for v in reward_verifiers(picked.reward, picked.verifier_set)] == ["judge_qwen3_8b"]
    for reward in ("rule", "annotated", "single_judge"):  # single_judge: the policy itself judges, no service
        none = typed("experiment=qwen3_8b_math", f"reward={reward}")
        assert reward_verifiers(none.reward, none.verifier_set) == []


def test_verifier_replicas_take_the_gpus_after_the_generators() -> None:
    c = OmegaConf.to_object(composed("experiment=qwen3_8b_math", "reward=weaver",
                                     "verifier_set.members.0.replicas=2"))
    members = served(c.verifier_set.members)
    gpus = assign_gpus(c)
    world = c.model.parallelism.trainer_world
    first = world + c.generator.replicas * c.generator.gpus_per_replica
    expect, nxt = {}, first
    for m in members:
        expect[f"verifier_{m.name}"] = [str(nxt + j) for j in range(m.replicas)]
        nxt += m.replicas
    assert {k: v for k, v in gpus.items() if k.startswith("verifier_")} == expect
    assert len(gpus[f"verifier_{members[0].name}"]) == 2  # one CUDA_VISIBLE_DEVICES value per replica
    assert gpus_needed(c) == nxt
    taken = [g for k, v in gpus.items() for x in v for g in x.split(",")]
    assert len(taken) == len(set(taken)) == nxt  # no GPU is given twice
    c.cluster.device = "cpu"
    assert assign_gpus(c) == {}


def test_plan_counts_a_single_rm_and_nothing_for_rule() -> None:
    single = plan_memory(typed("experiment=qwen3_8b_math", "reward=single_rm"))
    rule = plan_memory(typed("experiment=qwen3_8b_math", "reward=rule"))
    assert [v.name for v in single.verifiers] == ["rm_skywork_llama8b"] and rule.verifiers == []
    assert single.gpus_needed == rule.gpus_needed + 1
    assert "verifiers:" not in rule.table()


@pytest.mark.slow  # `rlexp train` in a subprocess or model training: the full suite runs it
def test_plan_cli_prints_each_verifier_mesh_and_counts_its_gpus(tmp_path: Path) -> None:
    p = run("plan", "experiment=qwen3_8b_math", "reward=weaver", tmp_path=tmp_path, timeout=120)
    assert p.returncode in (0, 1), p.stderr  # 1: does not fit, with the fixes printed
    assert "Traceback" not in p.stderr
    c = OmegaConf.to_object(composed("experiment=qwen3_8b_math", "reward=weaver"))
    members = served(c.verifier_set.members)
    n_verifier_gpus = sum(m.replicas for m in members)
    need = c.model.parallelism.trainer_world + c.generator.replicas * c.generator.gpus_per_replica + n_verifier_gpus
    out = p.stdout
    assert f"verifiers: {n_verifier_gpus} GPU(s)" in out and f"this layout uses {need}" in out
    for m in members:
        row = next((line for line in out.splitlines() if line.strip().startswith(m.name + " ")), None)
        assert row is not None, f"no mesh row for {m.name}:\n{out}"
        assert str(m.kind) in row and f"{m.memory_gb:.2f}" in row
        assert f"{m.options['hf_repo']}@{m.options['revision']}" in row
        assert row.split()[2] == str(m.replicas)
    if need > 8:  # gpu_node: one 8-GPU host
        assert f"needs {need} GPUs" in out and "verifiers" in out.split("problem:", 1)[1]


# ----------------------------------------------------------------------------------------------------
# rlexp train: refused before anything is spawned
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def refused_trains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    """The two `rlexp train` refusals below come after torch loads: one child runs both commands,
    as `run` would (empty Hugging Face cache, offline); each test reads its own (tests/cli_batch.py)."""
    from tests.cli_batch import rlexp_each

    tmp = tmp_path_factory.mktemp("refused")
    gpqa = ["environment=gpqa", f"environment.dataset={GPQA_FIXTURE}", "reward=weaver", "steps=2"]
    tag = uuid.uuid4().hex
    env = tagged_env(tag)
    env.update(HF_HUB_CACHE=str(tmp / "hf_cache"), HF_HUB_OFFLINE="1")
    try:
        missing, rules = rlexp_each(
            [["train", *gpqa, f"hydra.run.dir={tmp / 'missing'}"],
             ["train", "verifier_set=arithmetic_rules", *gpqa, f"hydra.run.dir={tmp / 'rules'}"]],
            env=env, timeout=300)
    finally:
        kill_tagged(tag)
    return {"missing": missing, "rules": rules}


@pytest.mark.slow  # `rlexp train` in a subprocess or model training: the full suite runs it
def test_missing_verifier_checkpoints_stop_before_spawning(refused_trains: dict) -> None:
    p = refused_trains["missing"]
    assert p.returncode == 2, f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert "actor graph" not in p.stdout and "Traceback" not in p.stderr
    first = served(OmegaConf.to_object(composed("verifier_set=gpqa")).verifier_set.members)[0]
    repo, rev = first.options["hf_repo"], first.options["revision"]
    assert repr(first.name) in p.stderr and f"{repo}@{rev}" in p.stderr
    assert f"hf download {repo} --revision {rev}" in p.stderr


@pytest.mark.slow  # `rlexp train` in a subprocess or model training: the full suite runs it
def test_rule_verifiers_cannot_score_gpqa(refused_trains: dict) -> None:
    p = refused_trains["rules"]
    assert p.returncode == 2, f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert "actor graph" not in p.stdout and "Traceback" not in p.stderr
    assert "verifier_set=arithmetic_rules" in p.stderr and "'mod5'" in p.stderr
    assert "kind rule" in p.stderr and "environment=gpqa" in p.stderr


@pytest.mark.parametrize("name", ["gpqa", "math", "mmlu_pro"])
def test_wide_sets_have_five_model_verifiers_of_several_families_and_room_for_the_filters(name: str) -> None:
    """Issue 46 item 5: with three model verifiers and min_active 3, one filter drop made weaver_paper the mean.
    Each task's wide set (the GPU table's) has at least five pinned model verifiers from more than one family (the
    Hub organisation), the default set's among them, and weaver_paper's min_active leaves room for two drops."""
    from rlexp.rewards.weaver_options import WeaverOptions

    vs = OmegaConf.to_object(composed(f"verifier_set={name}_wide")).verifier_set
    models = served(vs.members)
    assert len(models) >= 5, [m.name for m in models]
    default = served(OmegaConf.to_object(composed(f"verifier_set={name}")).verifier_set.members)
    assert [m.name for m in default] == [m.name for m in models][:2] + [m.name for m in models][3:4]
    assert [m.options for m in default] == [m.options for m in models][:2] + [m.options for m in models][3:4]
    assert all(HEX40.fullmatch(str(m.options["revision"])) for m in models), name
    families = {str(m.options["hf_repo"]).split("/")[0] for m in models}
    assert len(families) >= 3 and {"reward_model", "lm_judge"} <= {str(m.kind) for m in models}, families
    reward = OmegaConf.to_object(composed(f"verifier_set={name}_wide", "reward=weaver_paper")).reward
    assert WeaverOptions.from_options(dict(reward.options)).min_active <= len(models) - 2
    test_task_sets_are_pinned_sized_and_complete(f"{name}_wide")  # pinned, sized, options a verifier accepts
