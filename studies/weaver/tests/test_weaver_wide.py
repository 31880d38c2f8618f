"""studies/weaver/weaver_wide.py (addendum v14): the criterion reads the dev-256, registered-filters
cell only, and the table shows each cell's figures as computed (the measurement itself runs minutes
of CPU: not here)."""
from __future__ import annotations

import sys
from pathlib import Path

STUDY = Path(__file__).resolve().parents[1]
REPO = STUDY.parents[1]

sys.path.insert(0, str(STUDY))
import weaver_wide as ww  # noqa: E402  (the study folder is on sys.path just above)


def _cell(budget: int, filters: str, lm: float, wins: bool) -> dict:
    arm = {"n_active": 13, "fallback": False, "best_of_10_balanced": 0.99}
    diff = {"diff": lm - 0.95, "low": lm - 0.96, "high": lm - 0.94}
    return {
        "budget": budget,
        "filters": filters,
        "label_model_wins": wins,
        "arms": {
            "weaver_paper": {**arm, "group_auc": lm},
            "verifier_mean": {**arm, "group_auc": 0.95},
            "verifier_vote": {**arm, "group_auc": 0.80},
        },
        "paired": {"verifier_mean": diff, "verifier_vote": diff},
    }


def test_the_criterion_is_the_registered_cell_alone():
    cells = {
        "16/none": _cell(16, "none", 0.99, True),
        "256/registered": _cell(256, "registered", 0.90, False),
    }
    text = ww.markdown(cells, "cmd", 0.35)
    assert "with the registered filters: **it does not**" in text  # a win elsewhere does not count
    assert "| 16 | none | 13 | no | 0.990 | 0.950 | 0.800 | +0.040 [+0.030, +0.050]" in text
    cells["256/registered"] = _cell(256, "registered", 0.97, True)
    assert "**it does**" in ww.markdown(cells, "cmd", 0.35)


def test_the_grid_is_the_registered_one():
    assert ww.BUDGETS == (16, 32, 64, 256) and set(ww.ARMS) == {
        "weaver_paper",
        "verifier_mean",
        "verifier_vote",
    }
    assert set(ww.FILTERS) == {
        "registered",
        "none",
        "no min_quality",
        "no max_imbalance",
        "no max_correlation",
    }
