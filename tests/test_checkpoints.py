"""Run checkpoints: plain state round-trips, crafted pickles are refused before anything is spawned,
resume finds the newest complete checkpoint."""
from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import pytest
import torch

from rlexp.run import checkpoints
from rlexp.run.checkpoints import ResumeError
from rlexp.types import Episode, Problem, Sample
from tests.conftest import rlexp


class _RunsCode:
    """What an attacker would put in a checkpoint: unpickling it runs a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def _checkpoint(root: Path, controller: object, step: int = 2) -> Path:
    ckpt = root / "checkpoints" / f"step_{step:06d}"
    ckpt.mkdir(parents=True)
    torch.save(controller, ckpt / "controller.pt")
    torch.save({"model": {"w": torch.ones(2)}, "version": step}, ckpt / "trainer.pt")
    (ckpt / "meta.json").write_text(json.dumps({"step": step, "version": step, "resume_hash": "x"}))
    (ckpt / "COMPLETE").write_text("")
    return ckpt


def test_plain_controller_state_round_trips(tmp_path: Path) -> None:
    rng = random.Random(3)
    rng.random()
    sample = Sample(Problem("1+1", "1+1=", {"n": 2}), "2")
    ep = Episode([1, 2], [3], [-0.5], 0.7, 1.0, 4, None)
    state = {"loop": {"data_rng": rng.getstate(), "pending": [(3, [sample.to_plain()])]},
             "buffer": {"groups": [[ep.to_plain()]]}}
    ckpt = _checkpoint(tmp_path, state)
    back = checkpoints.load_controller_state(ckpt)
    again = random.Random()
    again.setstate(back["loop"]["data_rng"])
    assert again.random() == rng.random()
    assert Sample.from_plain(back["loop"]["pending"][0][1][0]) == sample
    assert Episode.from_plain(back["buffer"]["groups"][0][0]) == ep


def test_loop_state_saves_and_loads_itself_through_a_checkpoint(tmp_path: Path) -> None:
    from rlexp.algorithm.loop import LoopState

    rng = random.Random(5)
    rng.random()
    sample = Sample(Problem("2+2", "2+2=", {"n": 4}), "4")
    st = LoopState(step=7, version=3, data_rng=rng, samples_seen=40, pending=[(8, [sample])])
    ckpt = _checkpoint(tmp_path, {"loop": st.to_state()})
    back = LoopState.from_state(checkpoints.load_controller_state(ckpt)["loop"])
    assert (back.step, back.version, back.samples_seen, back.pending) == (7, 3, 40, [(8, [sample])])
    assert back.data_rng.random() == rng.random()  # the data order continues where it stopped


def test_crafted_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ckpt = _checkpoint(tmp_path, {"loop": _RunsCode(marker)})
    with pytest.raises(ResumeError, match=r"controller\.pt: it references Python objects \(posix\.system\)"):
        checkpoints.check_resumable(ckpt)
    with pytest.raises(ResumeError, match="could run code"):
        checkpoints.load_controller_state(ckpt)
    assert not marker.exists()


def test_a_raw_pickle_is_not_a_checkpoint(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ckpt = _checkpoint(tmp_path, {})
    with open(ckpt / "trainer.pt", "wb") as f:
        pickle.dump(_RunsCode(marker), f)
    with pytest.raises(ResumeError, match=r"trainer\.pt: it is not a checkpoint written by torch\.save"):
        checkpoints.check_resumable(ckpt)
    assert not marker.exists()


def test_find_resume_takes_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    _checkpoint(tmp_path, {}, step=2)
    newest = _checkpoint(tmp_path, {}, step=4)
    half = _checkpoint(tmp_path, {}, step=6)
    (half / "COMPLETE").unlink()
    assert checkpoints.find_resume("auto", tmp_path) == newest
    assert checkpoints.find_resume(str(tmp_path), tmp_path / "elsewhere") == newest
    assert checkpoints.find_resume("never", tmp_path) is None
    assert checkpoints.find_resume("auto", tmp_path / "fresh") is None
    with pytest.raises(ResumeError, match="no complete checkpoint"):
        checkpoints.find_resume(str(tmp_path / "fresh"), tmp_path)


@pytest.mark.slow  # `rlexp train` in a subprocess or model training: the full suite runs it
def test_train_refuses_a_crafted_checkpoint_before_spawning(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ckpt = _checkpoint(tmp_path / "old", {"loop": _RunsCode(marker)})
    p = rlexp("train", f"resume={ckpt}", f"hydra.run.dir={tmp_path / 'run'}", check=False, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "rlexp: error: refusing to load" in p.stderr and "posix.system" in p.stderr
    assert "Traceback" not in p.stderr and "actor graph" not in p.stdout
    assert not marker.exists()
