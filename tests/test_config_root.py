"""rlexp's one config home is found the same way installed and in a checkout (rlexp.config.paths.config_root):
inside the package where a wheel puts it, else the checkout's top-level conf/; a stray folder without train.yaml
does not shadow it, and a missing home is named with its fix. The wheel itself: tests/test_install.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from rlexp.config.paths import CONF_DIR, config_root
from tests.conftest import REPO


def _home(root: Path) -> Path:
    (root / "sweeps").mkdir(parents=True)
    (root / "train.yaml").write_text("defaults: []\n")
    return root


def test_this_checkout_uses_the_top_level_conf() -> None:
    assert CONF_DIR == REPO / "conf" and (CONF_DIR / "sweeps" / "grid.yaml").is_file()
    assert (CONF_DIR / "launchers" / "local.yaml").is_file()
    # A preset added at the old place (a branch merged without following the move) would be silently unused.
    left = sorted(str(p.relative_to(REPO)) for p in (REPO / "rlexp" / "conf").rglob("*.yaml"))
    assert not left, f"move these into conf/ (the one config home): {left}"


def test_an_installed_package_uses_its_own_conf(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    home = _home(site / "rlexp" / "conf")
    _home(site / "conf")  # a conf/ beside the installed package (someone else's) must not win
    assert config_root(site / "rlexp") == home


def test_a_checkout_uses_the_folder_beside_the_package_and_ignores_a_stray_one(tmp_path: Path) -> None:
    (tmp_path / "rlexp" / "conf" / "model").mkdir(parents=True)  # e.g. left behind by an old checkout
    home = _home(tmp_path / "conf")
    assert config_root(tmp_path / "rlexp") == home


def test_no_config_home_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"rlexp's configs are missing: .*train.yaml; reinstall rlexp"):
        config_root(tmp_path / "rlexp")
