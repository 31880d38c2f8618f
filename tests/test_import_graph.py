"""scripts/import_graph.py: the import-direction guard on the real tree, and its graph logic on a toy package."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from itertools import pairwise
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "import_graph.py"


def _load():
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


ig = _load()


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_no_import_cycle_through_orchestration():
    """Entry points -> orchestration -> components -> types: no cycle may run through the focus set."""
    proc = run_script("--check")
    focus = proc.stdout[proc.stdout.find("## Focus set"):proc.stdout.find("## Edges out")]
    assert proc.returncode == 0, focus + proc.stderr


def write_pkg(root: Path, files: dict[str, str]) -> Path:
    for rel, src in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    return root


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    return write_pkg(tmp_path, {
        "rlexp/__init__.py": "",
        "rlexp/types.py": "X = 1\n",
        "rlexp/launcher.py": """
            from rlexp.core import engine            # submodule named in a from-import
            from .types import X                     # relative import
            def run():
                from rlexp import controller         # function-level: still a coupling
                return controller
        """,
        "rlexp/controller.py": """
            import rlexp.launcher
        """,
        "rlexp/core/__init__.py": "from .engine import Engine\n",
        "rlexp/core/engine.py": """
            from typing import TYPE_CHECKING
            from ..types import X
            if TYPE_CHECKING:
                from rlexp.core.plugins import Plugin   # type-only: not a cycle
            else:
                import json
            class Engine:
                from . import plugins                  # class body runs at import: top level
        """,
        "rlexp/core/plugins.py": """
            from rlexp.core.engine import Engine
            import os, rlexp.core
        """,
        "rlexp/leaf.py": "import numpy\n",
    })


def test_edges_resolve_relative_submodule_and_kind(toy: Path):
    g = ig.build_graph(toy)
    assert set(g.modules) == {"rlexp", "rlexp.types", "rlexp.launcher", "rlexp.controller", "rlexp.core",
                              "rlexp.core.engine", "rlexp.core.plugins", "rlexp.leaf"}
    assert g.edges == {
        ("rlexp.launcher", "rlexp.core.engine"): "top",
        ("rlexp.launcher", "rlexp.types"): "top",
        ("rlexp.launcher", "rlexp.controller"): "function",
        ("rlexp.controller", "rlexp.launcher"): "top",
        ("rlexp.core", "rlexp.core.engine"): "top",
        ("rlexp.core.engine", "rlexp.types"): "top",
        ("rlexp.core.engine", "rlexp.core.plugins"): "top",
        ("rlexp.core.plugins", "rlexp.core.engine"): "top",
        ("rlexp.core.plugins", "rlexp.core"): "top",
    }
    assert ig.package_of("rlexp.core.engine") == "rlexp.core" and ig.package_of("rlexp") == "rlexp"


def test_type_checking_import_is_kept_but_not_a_cycle(tmp_path: Path):
    root = write_pkg(tmp_path, {
        "rlexp/__init__.py": "",
        "rlexp/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rlexp.b import B\n",
        "rlexp/b.py": "import rlexp.a\n",
    })
    g = ig.build_graph(root)
    assert g.edges[("rlexp.a", "rlexp.b")] == "type"
    assert ig.cycles(g.coupling()) == []
    assert ig.cycles(g.coupling(include_type=True)) == [["rlexp.a", "rlexp.b"]]


def test_cycles_and_example_path(toy: Path):
    g = ig.build_graph(toy)
    adj = g.coupling()
    comps = ig.cycles(adj)
    # launcher <-> controller only through a function-level import, still a cycle; engine <-> plugins;
    # core/__init__ -> engine -> plugins -> core closes a third loop into the same component.
    assert comps == [["rlexp.core", "rlexp.core.engine", "rlexp.core.plugins"], ["rlexp.controller", "rlexp.launcher"]]
    path = ig.example_cycle(adj, comps[1])
    assert path == ["rlexp.controller", "rlexp.launcher", "rlexp.controller"]
    for comp in comps:
        path = ig.example_cycle(adj, comp)
        assert path[0] == path[-1] and len(path) > 2
        assert all(b in adj[a] for a, b in pairwise(path))


def test_tarjan_on_plain_graph():
    adj = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": set(), "g": {"g"}}
    assert ig.cycles(adj) == [["a", "b", "c"], ["d", "e"]]
    assert ig.example_cycle(adj, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_check_exit_code_follows_focus(toy: Path, tmp_path: Path):
    bad = run_script("--root", str(toy), "--check", "--focus", "rlexp.launcher")
    assert bad.returncode == 1, bad.stdout
    assert "rlexp.controller -[top]-> rlexp.launcher -[function]-> rlexp.controller" in bad.stdout
    assert "- rlexp.launcher -> rlexp.controller (function)" not in bad.stdout  # controller is outside the focus
    # `rlexp.core` stands for the package: its modules are in a cycle too.
    assert run_script("--root", str(toy), "--check", "--focus", "rlexp.core").returncode == 1
    # No cycle through these; the check still fails, on the launcher <-> controller package cycle alone.
    ok = run_script("--root", str(toy), "--check", "--focus", "rlexp.types", "rlexp.leaf",
                    "--dot", str(tmp_path / "g.dot"))
    assert ok.returncode == 1 and "through the focus set" not in ok.stderr, ok.stderr
    assert ok.stderr.strip().splitlines() == [
        "import_graph: package cycle: rlexp.controller -> rlexp.launcher -> rlexp.controller"]
    assert "- modules: 8 in 6 packages" in ok.stdout
    dot = (tmp_path / "g.dot").read_text()
    assert dot.startswith("digraph") and '"rlexp.launcher" -> "rlexp.core"' in dot
    assert '"rlexp.controller" -> "rlexp.launcher" [style=solid, label="1", color=red]' in dot


def _layered(tmp_path: Path, extra: dict[str, str]) -> Path:
    """A tree whose modules sit in the real layers: types < core (weights) < components (models, transport) <
    orchestration (run.launcher) < entry points (cli), every import pointing down or sideways."""
    return write_pkg(tmp_path, {
        "rlexp/__init__.py": "",
        "rlexp/types.py": "X = 1\n",
        "rlexp/core/__init__.py": "",
        "rlexp/core/weights.py": "from rlexp.types import X\n",
        "rlexp/models/__init__.py": "",
        "rlexp/models/hf.py": "from rlexp.core.weights import X\n",
        "rlexp/transport/__init__.py": "",
        "rlexp/transport/shm.py": "from rlexp.core.weights import X\nfrom rlexp.models import hf\n",
        "rlexp/run/__init__.py": "",
        "rlexp/run/launcher.py": "from rlexp.transport import shm\n",
        "rlexp/cli.py": "def main():\n    from rlexp.run import launcher\n",
        **extra,
    })


def test_check_passes_a_tree_that_imports_one_way(tmp_path: Path):
    ok = run_script("--root", str(_layered(tmp_path, {})), "--check")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "- package cycles (SCCs > 1): 0" in ok.stdout and "- upward imports (a layer importing a higher one): 0" \
        in ok.stdout


def test_check_fails_on_a_package_cycle_even_without_a_module_cycle(tmp_path: Path):
    """models.backends -> transport.shm and transport.shm -> models.hf: no module cycle, but the packages import
    each other (the models <-> transport cycle rlexp.weights removed)."""
    root = _layered(tmp_path, {"rlexp/models/backends.py": "def f():\n    from rlexp.transport.shm import X\n"})
    bad = run_script("--root", str(root), "--check")
    assert bad.returncode == 1, bad.stdout
    assert "import_graph: package cycle: rlexp.models -> rlexp.transport -> rlexp.models" in bad.stderr
    assert "- module cycles (SCCs > 1): 0" in bad.stdout


def test_check_fails_on_an_upward_import_not_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = _layered(tmp_path, {"rlexp/bench.py": "X = 1\n",  # an entry point importing nothing: no cycle
                               "rlexp/models/tokenizer.py": "def f():\n    from rlexp.bench import X\n"})
    bad = run_script("--root", str(root), "--check")
    assert bad.returncode == 1, bad.stdout
    assert bad.stderr.strip() == ("import_graph: upward import: rlexp.models.tokenizer (components) -> "
                                  "rlexp.bench (entry points)")
    assert "rlexp.models.tokenizer (components) -> rlexp.bench (entry points), function line 2: NOT ALLOWED" \
        in bad.stdout
    # An allow-listed upward import passes, named as allowed (the real list is empty: no upward import is left).
    root = _layered(tmp_path / "b", {"rlexp/actors/__init__.py": "", "rlexp/run/checkpoints.py": "",
                                     "rlexp/actors/trainer.py": "from rlexp.run.checkpoints import safe_load\n"})
    edge = ("rlexp.actors.trainer", "rlexp.run.checkpoints")
    text, failures = ig.report(ig.build_graph(root), ig.DEFAULT_FOCUS, root)
    assert failures and "upward import" in failures[0]
    monkeypatch.setitem(ig.ALLOWED_UPWARD, edge, "a test's exception")
    text, failures = ig.report(ig.build_graph(root), ig.DEFAULT_FOCUS, root)
    assert failures == [], failures
    assert ("rlexp.actors.trainer (components) -> rlexp.run.checkpoints (orchestration), top line 1: allowed"
            in text)
    assert ig.layer_of("rlexp.cluster.plan_cli") == 4 and ig.layer_of("rlexp.models.hf") == 2
    assert ig.layer_of("rlexp.core.services") == 1 and ig.layer_of("rlexp.run.wiring") == 3
    assert ig.layer_of("rlexp") is None


def test_real_tree_has_no_package_cycle_and_only_allowed_upward_imports():
    proc = run_script("--check")
    assert "- package cycles (SCCs > 1): 0" in proc.stdout, proc.stdout
    assert "NOT ALLOWED" not in proc.stdout and proc.returncode == 0, proc.stderr
