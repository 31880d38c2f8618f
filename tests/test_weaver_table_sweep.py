"""conf/sweeps/weaver_table.yaml (issue 46 item 5): the GPU table as one sweep, composed with real Hydra (no run).
Every arm x seed composes on experiment=qwen3_8b_math into a reward the schema accepts; single_rm and
best_verifier carry the per-answer debiasing every other verifier arm has; best_verifier names a member of the
set; and the reward each arm builds scores with the verifiers the analysis expects."""
from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rlexp.config.reward import RewardConfig, VerifierConfig
from rlexp.config.schema import register_configs
from rlexp.rewards.registry import reward_class
from rlexp.rewards.weaver import WeaverOptions
from tests.conftest import REPO

ARMS = ["single_rm_debiased", "best_verifier", "verifier_mean", "verifier_vote", "weaver_paper", "weaver",
        "annotated"]


def _params() -> dict[str, list[str]]:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        c = compose(overrides=["+sweeps=weaver_table"], return_hydra_config=True)
    return {k: str(v).split(",") for k, v in c.hydra.sweeper.params.items()}


def test_the_table_sweeps_every_arm_over_five_seeds():
    p = _params()
    assert p["reward"] == ARMS and p["seed"] == ["0", "1", "2", "3", "4"]


def test_every_arm_composes_on_qwen3_8b_math_with_fair_debiasing():
    p = _params()
    arms, fixed = p["reward"], [f"{k}={v[0]}" for k, v in p.items() if len(v) == 1]  # cluster, verifier_set
    register_configs()  # the typed schemas train.yaml extends, as `rlexp train` registers them
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for arm in arms:
            c = compose("train", overrides=["experiment=qwen3_8b_math", f"reward={arm}", "seed=3", *fixed])
            assert c.seed == 3 and c.environment.name == "math" and c.model.name.lower().startswith("qwen3")
            reward = OmegaConf.merge(OmegaConf.structured(RewardConfig), c.reward)
            opts = OmegaConf.to_container(reward.options)
            listed = OmegaConf.to_container(c.reward.verifiers) or OmegaConf.to_container(c.verifier_set.members)
            members = [VerifierConfig(**m) for m in listed]  # the set the run scores with (verifier_set=math)
            if reward.name == "single_rm":
                assert opts["debias_answers"] is True and opts["reference_groups"] == 128, arm
                picked = reward_class(reward.name).chosen_verifiers(opts, members)[0]
                assert picked.kind == "reward_model"
                assert picked.name == ("rm_skywork_qwen3_4b" if arm == "best_verifier" else "rm_skywork_llama8b")
            elif reward.name == "weaver":
                o = WeaverOptions.from_options(opts)  # the options the reward will accept
                assert o.debias_answers == (arm != "weaver") and len(members) == 8  # math_wide: six models
            else:
                assert arm == "annotated" and reward.name == "annotated"
