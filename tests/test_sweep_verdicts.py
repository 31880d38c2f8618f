"""Sweep verdicts that cannot mislead (issue 45 item 4): each configuration's change from its start
with an interval, "distinguishable" only over >= 3 paired seeds, a winner that did not beat its
start called out, and reproductions kept out of the sweep a later `rlexp compare` reads. Run folders
are written by rlexp's own trackers (tests/test_compare.py `_make_run`: manifest, Hydra files,
metrics.jsonl through `JsonlTracker`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlexp.tracking.compare import compare
from rlexp.tracking.manifest import REPRODUCTION_ENV, REPRODUCTION_KEY, read_manifest
from rlexp.tracking.reproduce import child_env, main as reproduce_main, reproduce_dir
from rlexp.tracking.stats import estimate
from tests.test_compare import _make_run


def _lr_sweep(root: Path, curves: dict[str, list[list[float]]]) -> None:
    """A Hydra-shaped sweep folder (multirun.yaml, job folders 0..n) of `reward` configurations x
    seeds; each seed's held-out accuracy curve is given, step 0 first."""
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text("hydra: {mode: MULTIRUN}\n")
    job = 0
    for reward, per_seed in curves.items():
        for seed, accs in enumerate(per_seed):
            _make_run(root / str(job), reward, seed, accs)
            job += 1


def test_two_paired_seeds_are_never_distinguishable(tmp_path: Path) -> None:
    """The issue's case: a clear gap on 2 seeds was called "distinguishable". The paired difference
    is still shown with its interval; the verdict says why it does not call it."""
    _lr_sweep(
        tmp_path / "two", {"rule": [[0.1, 0.30], [0.1, 0.31]], "weaver": [[0.1, 0.60], [0.1, 0.62]]}
    )
    v = compare([str(tmp_path / "two")], tmp_path / "out")["verdict"]
    assert (
        v.best.label == "reward.name=weaver" and v.paired_seeds == [0, 1] and not v.distinguishable
    )
    assert v.difference.mean == pytest.approx(0.305)
    assert (
        "not distinguishable: only 2 paired seeds, and a difference is called with at least 3"
        in v.sentence
    )
    # a third seed with the same gap: now it is called
    _lr_sweep(
        tmp_path / "three",
        {
            "rule": [[0.1, 0.30], [0.1, 0.31], [0.1, 0.32]],
            "weaver": [[0.1, 0.60], [0.1, 0.62], [0.1, 0.61]],
        },
    )
    v = compare([str(tmp_path / "three")], tmp_path / "out3")["verdict"]
    assert v.distinguishable and v.sentence.endswith(": distinguishable.")


def test_change_from_start_is_in_the_table_and_a_winner_below_its_start_is_called_out(
    tmp_path: Path,
) -> None:
    """Issue 45's sweep: the winner's final accuracy 0.388 was below its step-0 value 0.396, and
    nothing said so."""
    starts, ends = [0.396, 0.40, 0.39], [0.388, 0.39, 0.385]
    _lr_sweep(
        tmp_path / "sw",
        {
            "weaver": [[s, 0.5, e] for s, e in zip(starts, ends)],
            "rule": [[s, 0.3, e - 0.1] for s, e in zip(starts, ends)],
        },
    )
    res = compare([str(tmp_path / "sw")], tmp_path / "out")
    v, head, rows = res["verdict"], res["header"], res["rows"]
    want = estimate([e - s for s, e in zip(starts, ends)])
    assert v.best.label == "reward.name=weaver" and v.beat_start is False
    assert v.change.mean == pytest.approx(want.mean) and v.change.half == pytest.approx(want.half)
    assert (
        f"WARNING: it did not beat its start: change from its first value {want.mean:+.4g} ["
        in v.sentence
    )
    assert want.mean == pytest.approx(-0.007667, abs=1e-6)
    col = head.index("eval/accuracy final change from start mean")
    assert rows[0][col] == f"{want.mean:.4g}" and rows[0][col + 1] == f"{want.half:.4g}"
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "| eval/accuracy final: change from start |" in md.splitlines()[2]
    assert f"| {want.mean:.4g} ± {want.half:.4g} |" in md
    assert "change from start = the statistic minus the curve's first logged value" in md
    # a winner that did climb says by how much, and whether seeds can tell it from no change
    _lr_sweep(
        tmp_path / "up",
        {
            "weaver": [[0.1, 0.5, 0.6], [0.1, 0.5, 0.62], [0.12, 0.5, 0.61]],
            "rule": [[0.1, 0.2, 0.3]] * 3,
        },
    )
    v = compare([str(tmp_path / "up")], tmp_path / "out_up")["verdict"]
    assert (
        v.beat_start is True
        and "Change from its start: +0.5033" in v.sentence
        and "WARNING" not in v.sentence
    )
    _lr_sweep(
        tmp_path / "noise",
        {
            "weaver": [[0.1, 0.5, 0.4], [0.5, 0.5, 0.2], [0.2, 0.5, 0.5]],
            "rule": [[0.1, 0.2, 0.1]] * 3,
        },
    )
    v = compare([str(tmp_path / "noise")], tmp_path / "out_noise")["verdict"]
    assert v.beat_start is True and "is within seed noise" in v.sentence


# Stands in for `python -m rlexp train` (a real process with the environment reproduce gives its
# child): writes the run folder the way a run does, through rlexp's own manifest writer, with the
# original's metrics.
_TRAIN = """
import json, shutil, sys
from pathlib import Path
from omegaconf import OmegaConf
from rlexp.tracking.manifest import write_start_manifest
new, orig = Path(sys.argv[1]), Path(sys.argv[2])
cfg = OmegaConf.load(orig / ".hydra" / "config.yaml")
(new / ".hydra").mkdir(parents=True)
shutil.copy(orig / ".hydra" / "config.yaml", new / ".hydra" / "config.yaml")
write_start_manifest(new, cfg, ["rlexp", "train"], {"global": int(cfg.seed)}, {}, repo_dir=new)
shutil.copy(orig / "metrics.jsonl", new / "metrics.jsonl")
"""


def test_a_reproduced_sweep_job_lands_beside_the_sweep_and_compare_leaves_reproductions_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Before: `rlexp reproduce <sweep>/0` wrote `<sweep>/reproduce/...`, and `rlexp compare
    <sweep>` read it as a third run of seed 0's configuration and stopped pairing."""
    sweep = tmp_path / "runs" / "multirun" / "2026-12-06_04-00-00"
    _lr_sweep(
        sweep,
        {
            "rule": [[0.1, 0.30], [0.1, 0.31], [0.1, 0.32]],
            "weaver": [[0.1, 0.60], [0.1, 0.62], [0.1, 0.61]],
        },
    )
    before = compare([str(sweep)], tmp_path / "before")["verdict"]
    assert before.distinguishable and before.paired_seeds == [0, 1, 2]
    assert reproduce_dir(sweep / "3").parent == sweep.with_name(sweep.name + ".reproduce")
    assert (
        reproduce_dir(tmp_path / "plain").parent == tmp_path / "reproduce"
    )  # a plain run: as before
    assert child_env(reproduction_of=sweep / "3")[REPRODUCTION_ENV] == str((sweep / "3").resolve())

    real_run = subprocess.run

    def train(
        cmd, cwd=None, env=None
    ):  # the real process reproduce starts, running _TRAIN instead of training
        new = Path(cmd[-1].split("=", 1)[1])
        return real_run(
            [sys.executable, "-c", _TRAIN, str(new), str(sweep / "3")], cwd=cwd, env=env
        )

    monkeypatch.setattr("rlexp.tracking.reproduce.subprocess.run", train)
    assert reproduce_main([str(sweep / "3")]) == 0
    (new,) = list(sweep.with_name(sweep.name + ".reproduce").iterdir())
    assert read_manifest(new).extra[REPRODUCTION_KEY] == str((sweep / "3").resolve())
    assert not any(p.name == "reproduce" for p in sweep.rglob("*"))

    # A reproduction inside the folder compare reads (one made before this fix, or a runs root
    # holding both) is left out and named; the verdict pairs the three seeds as before.
    inside = sweep / "reproduce" / new.name
    inside.parent.mkdir()
    new.rename(inside)
    res = compare([str(sweep)], tmp_path / "after")
    after = res["verdict"]
    assert len(res["runs"]) == 6 and after.paired_seeds == [0, 1, 2] and after.distinguishable
    assert after.sentence == before.sentence
    assert any(
        n.startswith("left out 1 reproduction(s)") and str(inside) in n for n in res["notes"]
    )
    # named on its own, a reproduction is read: the user asked for that folder
    assert [r.source for r in compare([str(inside)], tmp_path / "own")["runs"]] == [str(inside)]
    json.dumps(res["notes"])  # plain text, for compare.md


REAL = Path(__file__).parent / "fixtures" / "multi_token_runs"  # docs/multi_token.md's runs, seed 0


def _real_run(run: Path, env: str, metrics: Path) -> None:
    """A run folder with a real run's metrics.jsonl (`rlexp train environment=<env>`, 30 steps)."""
    from omegaconf import OmegaConf

    from rlexp.tracking.manifest import write_start_manifest

    cfg = OmegaConf.create({"seed": 0, "environment": {"name": env}})
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    write_start_manifest(run, cfg, ["rlexp", "train", f"environment={env}"], {"global": 0}, {},
                         repo_dir=run)
    (run / "metrics.jsonl").write_bytes(metrics.read_bytes())


def test_real_runs_the_change_from_start_and_a_winner_that_stayed_at_zero(tmp_path: Path) -> None:
    """Two real 30-step runs (sort and the user's reverse task, defaults, seed 0): held-out exact
    match stayed 0.0 in both, so the winner by it did not beat its start; by partial credit sort
    gained and reverse lost, and the table's change is the file's last value minus its step 0."""
    sweep = tmp_path / "sw"
    for job, env in enumerate(("sort", "reverse")):
        _real_run(sweep / str(job), env, REAL / f"{env}_default_s0.metrics.jsonl")
    v = compare([str(sweep)], tmp_path / "out")["verdict"]
    assert v.beat_start is False and "WARNING: it did not beat its start" in v.sentence
    assert "Not distinguishable: they share fewer than 2 seeds" in v.sentence
    res = compare([str(sweep)], tmp_path / "pc", metrics=["eval/partial_credit"])
    head, rows = res["header"], {r[1]: r for r in res["rows"]}
    for env in ("sort", "reverse"):
        evals = [r for r in map(json.loads, (REAL / f"{env}_default_s0.metrics.jsonl").open())
                 if "eval/partial_credit" in r]
        want = evals[-1]["eval/partial_credit"] - evals[0]["eval/partial_credit"]
        col = head.index("eval/partial_credit final change from start mean")
        assert rows[f"environment.name={env}"][col] == f"{want:.4g}"
    assert res["verdict"].best.label == "environment.name=sort" and res["verdict"].beat_start
    assert "Change from its start: +0.4484 (n=1)" in res["verdict"].sentence
