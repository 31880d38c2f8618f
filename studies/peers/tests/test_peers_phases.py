"""studies/peers/peers_phases.py: seconds per step by phase, from a peers sweep folder (written
here, not run)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

STUDY = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("peers_phases", STUDY / "peers_phases.py")
phases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(phases)


def test_phases_from_curves_and_rlexp_metrics(tmp_path: Path):
    # rlexp: 1 s a step for 30 steps, then 0.2 s; plain: 0.5 s throughout; evaluations every 10
    # steps
    def curve(rate):
        t, out = 0.0, []
        for s in range(0, 301, 10):
            out.append([s, 0.5, t + 3.0, t])
            t += 10 * rate(s + 1)
        return out

    runs = [
        {
            "task": "sort",
            "framework": "rlexp",
            "seed": 0,
            "curve": curve(lambda s: 1.0 if s <= 30 else 0.2),
        },
        {"task": "sort", "framework": "plain", "seed": 0, "curve": curve(lambda s: 0.5)},
    ]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    run = tmp_path / "sort-rlexp-s0"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps(
                {
                    "step": s,
                    "time/train_step_s": 0.7 if s <= 30 else 0.05,
                    "time/generate_s": 0.3 if s <= 30 else 0.15,
                }
            )
            for s in range(1, 301)
        )
    )
    out = tmp_path / "phases.md"
    assert phases.main([str(tmp_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert (
        "| sort | rlexp | 0 | 1.000 (0.700 / 0.300) | 0.200 (0.050 / 0.150) | 0.200 (0.050 / "
        "0.150) |"
        in text
    )
    assert "| sort | plain | 0 | 0.500 | 0.500 | 0.500 |" in text


def test_a_folder_without_runs_json_is_refused_naming_what_to_pass(tmp_path: Path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        phases.main([str(tmp_path), "--out", str(tmp_path / "x.md")])
    assert "has no runs.json" in capsys.readouterr().err and not (tmp_path / "x.md").exists()
