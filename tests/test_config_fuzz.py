"""Fuzz of the config boundary: random and adversarial overrides through what `rlexp train` does before it spawns
anything (Hydra composition, then `rlexp.run.prepare.check_config`) and through the gate a run folder's overrides pass
(`rlexp.config.overrides.check_overrides`). Every case must end in a valid config or in a user error naming the
key: never a raw exception, never a process. Seeded, so a failure replays; bounded to a few seconds of work."""
from __future__ import annotations

import dataclasses
import random
import re
import time
import typing
from pathlib import Path
from typing import Any

import pytest
from cli_batch import rlexp_each
from conftest import tagged_env, tagged_pids
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlexp.config.overrides import OverrideError, check_overrides
from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import TrainConfig, register_configs
from rlexp.errors import is_user_error
from rlexp.run.prepare import check_config

SEED = 20260520
BUDGET_S = 55.0

VALUES = ["nan", "inf", "-inf", "+inf", "NaN", "1e308", "-1e308", "1e-320", str(10**30), str(-10**30), "-1", "0",
          "1", "3", "0.5", "-0.5", "2.5", "''", "abc", "true", "null", "[]", "[1,2]", "[nan]", "{a: 1}",
          "'ü'", "'日本語'", "'\u202e'", "${oc.env:HOME}", "${oc.env:RLEXP_FUZZ_UNSET}", "${now:%H}", "${seed}",
          "${steps}", "${nope.x}", "'${oc.decode:1}'", "{_target_: os.system, _args_: [ls]}", "[{_partial_: true}]"]
ADVERSARIAL = [
    "+hydra.callbacks.x._target_=pathlib.Path.write_text",
    "+hydra.callbacks.x._args_=[{_target_:pathlib.Path,_args_:[/tmp/rlexp_fuzz_pwned]},'x']",
    "hydra.job.env_set.LD_PRELOAD=/tmp/x.so", "hydra/launcher=basic", "+hydra.job.chdir=true",
    "+environment.options._target_=os.system", "+extra._target_=os.system", "+extra.x={_target_: os.system}",
    "+environment.options.x._partial_=true", "trainer._args_=[1]", "+trainer._target_=x",
    "+environment.options.nterms=5", "+environment.options.n_terms=5", "+environment.options.n_terms=nan",
    "+environment.options.n_terms=abc", "+environment.options.verifier_frac=inf", "+environment.options.ü=1",
    "+environment.options.''=1", "trainer.lrr=1", "+trainer.lrr=1", "ü=1", "=1", "", "trainer.lr=", "model=nope",
    "model=../../etc/passwd", "+experiment=nope", "+experiment=weaver_cpu", "environment=sort", "reward=weaver",
    "tags=[${oc.env:HOME}]", "trainer.lr=${oc.env:HOME}", "seed=${oc.env:RLEXP_FUZZ_UNSET}", "x@y=1",
    "seed=1,2", "seed=range(3)", "~seed", "~trainer", "++seed=4", "trainer.betas=[0.9]", "trainer.betas=[nan,0.9]",
    "trainer.betas.0=2", "reward.verifiers.0.name=x", "cluster.hosts_per_role.trainer=-1",
]


def _leaves(tp: Any = TrainConfig, prefix: str = "") -> list[str]:
    """Every key of the schema that holds a value."""
    out: list[str] = []
    for f in dataclasses.fields(tp):
        hint = typing.get_type_hints(tp)[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hint):
            out += _leaves(hint, f"{key}.")
        else:
            out.append(key)
    return out


def _cases(rng: random.Random, singles: int, multis: int) -> list[list[str]]:
    """The adversarial list, then random schema keys with random hostile values, alone and in groups (a
    composition costs ~0.15 s, so the composed share is kept small; the gate alone takes thousands)."""
    keys = _leaves()
    cases = [[a] for a in ADVERSARIAL]
    cases += [[f"{rng.choice(['', '+', '++', '~'])}{rng.choice(keys)}={rng.choice(VALUES)}"] for _ in range(singles)]
    cases += [[f"{rng.choice(keys)}={rng.choice(VALUES)}" for _ in range(rng.randint(2, 4))] for _ in range(multis)]
    return cases


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("~+")


def _names_a_key(message: str, overrides: list[str]) -> bool:
    """The message names one of the overrides' keys (or the last part of it, as OmegaConf does)."""
    for o in overrides:
        key = _key(o)
        if o and (o in message or (key and (key in message or key.split(".")[-1] in message))):
            return True
    return False


def _walk_strings(node: Any) -> list[tuple[str, str]]:
    if isinstance(node, dict):
        return [(str(k), "key") for k in node] + [s for v in node.values() for s in _walk_strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _walk_strings(v)]
    return [(node, "value")] if isinstance(node, str) else []


@pytest.fixture(scope="module")
def hydra_conf():
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        yield


def test_fuzzed_overrides_compose_validly_or_are_refused_naming_the_key(hydra_conf) -> None:
    rng = random.Random(SEED)
    start, outcomes = time.monotonic(), {"valid": 0, "refused at composition": 0, "refused by check_config": 0}
    gate = {"passed": 0, "refused": 0}
    for overrides in _cases(rng, singles=35, multis=10):
        assert time.monotonic() - start < BUDGET_S, f"fuzz over its time budget at {overrides}"
        # 1. the gate for overrides read back from a run folder
        try:
            check_overrides(overrides, "fuzz")
            gated = True
            gate["passed"] += 1
        except OverrideError as e:
            gated = False
            gate["refused"] += 1
            assert is_user_error(e) and "fuzz: refusing override" in str(e)
            assert any(repr(o) in str(e) for o in overrides), str(e)
        # 2. what `rlexp train` does before spawning
        try:
            cfg = compose(config_name="train", overrides=overrides)
        except (HydraException, OmegaConfBaseException, ValueError) as e:  # Hydra reports these in one message
            outcomes["refused at composition"] += 1
            assert _names_a_key(str(e), overrides) or "override" in str(e).lower(), (overrides, str(e))
            continue
        try:
            typed = check_config(cfg)
        except Exception as e:
            assert is_user_error(e), f"{overrides}: raw {type(e).__name__}: {e}"
            assert _names_a_key(str(e), overrides) or "environment=" in str(e), (overrides, str(e))
            outcomes["refused by check_config"] += 1
            continue
        outcomes["valid"] += 1
        assert isinstance(typed, TrainConfig)
        if gated:  # what passes the gate carries no instantiation key and no resolver into the config
            raw = OmegaConf.to_container(cfg, resolve=False)
            for s, kind in _walk_strings(raw):
                assert not re.fullmatch(r"_[A-Za-z]+_", s), (overrides, s)
                assert kind == "key" or ("${oc." not in s and "${now" not in s), (overrides, s)
    assert not Path("/tmp/rlexp_fuzz_pwned").exists()
    # the fuzz reached every branch, so a change that refused (or admitted) everything would show
    assert min(outcomes.values()) > 5 and min(gate.values()) > 5, (outcomes, gate)


def test_the_gate_refuses_naming_the_override_or_admits_only_schema_keys() -> None:
    """Thousands of cases through `check_overrides` alone (no composition): refused naming the override, or
    admitted with a key of the schema, a group option that exists, or a run-folder key, and no special key."""
    rng = random.Random(SEED + 1)
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}
    seen = {"passed": 0, "refused": 0}
    for overrides in _cases(rng, singles=2000, multis=300):
        try:
            check_overrides(overrides, "fuzz")
        except OverrideError as e:
            seen["refused"] += 1
            assert any(repr(o) in str(e) for o in overrides), str(e)
            continue
        seen["passed"] += 1
        for o in overrides:
            key, value = _key(o), o.split("=", 1)[-1]
            assert not re.search(r"(^|\.)_[A-Za-z]+_($|\.)", key) and "_target_" not in value, o
            assert "${oc." not in value and "${now" not in value, o
            assert key.split(".")[0] in {f.name for f in dataclasses.fields(TrainConfig)} | groups | {"hydra"}, o
            assert not key.startswith("hydra") or key in ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")
    assert min(seen.values()) > 100, seen


def test_fuzz_cases_through_the_real_cli(tmp_path: Path, tag: str) -> None:
    """A few cases as a user meets them: one line on stderr, no traceback, nothing spawned."""
    cases = (
        (["trainer.lr=${oc.env:HOME}"], 2, ["trainer.lr"]),
        (["algorithm.temperature=-inf"], 2, ["algorithm.temperature"]),
        ([f"seed={10**30}"], 2, ["seed"]),
        (["+environment.options._target_=os.system"], 2, ["_target_"]),
        # refused by rlexp's preflight before Hydra composes, with the close match (exit 2)
        (["trainer.lrr=1"], 2, ["trainer.lrr", "did you mean trainer.lr?"]),
    )
    # the six commands in one child (tests/cli_batch.py), each with its own exit code and stderr
    *done, p = rlexp_each([*(["train", *o, f"hydra.run.dir={tmp_path / 'r'}"] for o, _, _ in cases),
                           ["train", "--cfg", "job", "trainer.lrr=1"]], env=tagged_env(tag), timeout=300)
    for (overrides, code, words), q in zip(cases, done):
        assert q.returncode == code, (overrides, q.stdout[-2000:], q.stderr[-2000:])
        assert "Traceback" not in q.stderr and all(w in q.stderr for w in words), (overrides, q.stderr)
    assert not tagged_pids(tag)
    assert p.returncode == 2 and "trainer.lrr" in p.stderr and "Traceback" not in p.stderr
