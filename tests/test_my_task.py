"""examples/my_task driven by a user's own script (the route a researcher coming from TRL or TorchForge takes):
the script imports its module and calls `rlexp.cli.main`. The README route (train, a two-seed sweep, compare,
reproduce from another folder) runs against the installed wheel in tests/test_install.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, metrics, wait_no_orphans

TINY = ["algorithm.prompts_per_step=8", "algorithm.group_size=4", "eval.every_n_steps=2"]


WRAPPER = """import sys
import wraptasks  # registers count_w; a module beside this script, not listed in plugins
from rlexp.cli import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_wrapper_script_route(tmp_path: Path, tag: str) -> None:
    """The route the issue saw die in the reward actor 73 s in: a script imports its own module (which registers a
    name) and calls `rlexp.cli.main`, run from another folder. The actors import that module too."""
    import subprocess
    import sys

    from tests.conftest import tagged_env

    project = tmp_path / "my_task"
    shutil.copytree(REPO / "examples" / "my_task", project, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "wraptasks.py").write_text("from mytask.tasks import CountA\nfrom rlexp.envs.base import register_env"
                                          "\n\n\n@register_env('count_w')\nclass CountW(CountA):\n    pass\n")
    (project / "run.py").write_text(WRAPPER)
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = subprocess.run([sys.executable, str(project / "run.py"), "train", f"config_path={project / 'conf'}",
                        "environment=count_a", "environment.name=count_w", "reward=near_miss", "steps=1", *TINY,
                        f"hydra.run.dir={run}"], cwd=elsewhere, env=tagged_env(tag), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert [r["step"] for r in metrics(run) if "reward/mean" in r] == [1]
    m = json.loads((run / "manifest.json").read_text())
    assert {"module": "wraptasks", "by_name": True}.items() <= next(
        e for e in m["plugins"] if e["module"] == "wraptasks").items()
    assert wait_no_orphans(tag) == []
