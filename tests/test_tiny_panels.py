"""The tiny verifier panels (issue 23 item 4) are independently trained and wired as their verifier sets say:
a panel that shared a member's training data with another, or a set that listed another panel's member, would make
"the result holds on more than one panel" a statement about one panel."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlexp.rewards.verifiers.tiny_panels import PANEL_SETS as SETS, PANELS, TINY_VERIFIERS, WIDE_PANELS, WIDE_SET
from tests.conftest import REPO


def test_every_member_of_every_panel_draws_its_own_training_data() -> None:
    seeds = [spec.seed for panel in PANELS.values() for spec in panel.values()]
    assert len(seeds) == len(set(seeds)), "two tiny verifiers share a seed, so the same training examples"
    assert set(TINY_VERIFIERS) == {n for panel in PANELS.values() for n in panel}


@pytest.mark.parametrize("panel", sorted(SETS))
def test_each_verifier_set_lists_exactly_its_panel_with_single_rm_first(panel: str) -> None:
    members = OmegaConf.load(REPO / "conf" / "verifier_set" / f"{SETS[panel]}.yaml").members
    learned = [m for m in members if m.kind in ("reward_model", "lm_judge")]
    assert {m.options.tiny for m in learned} == set(PANELS[panel])
    assert all(m.kind == PANELS[panel][m.options.tiny].kind for m in learned)
    assert learned[0].kind == "reward_model", "single_rm takes the set's first reward model"
    assert {m.kind for m in members} - {"reward_model", "lm_judge"} == {"majority", "format"}


def test_the_wide_set_is_a_d_and_e_with_their_twins() -> None:
    """Panel W (addendum v14): every model verifier of A, D and E plus the four retrained twins, each twin the
    same recipe as its original but another seed (so its errors correlate with, and are not equal to, the
    original's)."""
    members = OmegaConf.load(REPO / "conf" / "verifier_set" / f"{WIDE_SET}.yaml").members
    learned = [m for m in members if m.kind in ("reward_model", "lm_judge")]
    want = {n for p in WIDE_PANELS for n in PANELS[p]}
    assert [m.options.tiny for m in learned] == [m.name for m in learned] and {m.name for m in learned} == want
    assert len(learned) == 22 and learned[0].name == "rm_large"
    for twin, spec in PANELS["W"].items():
        original = TINY_VERIFIERS[twin.removesuffix("_twin")]
        assert spec.seed != original.seed and {**vars(spec), "seed": 0} == {**vars(original), "seed": 0}
