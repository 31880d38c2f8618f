"""Several `rlexp` commands in one child process, each through the real entry point
(`rlexp.cli.main`), for tests of refusals that come after torch loads: each separate
`python -m rlexp train` pays the interpreter's start and torch's import (~6 s of CPU on two cores),
one child pays them once. Each command gets its own exit code, stdout and stderr, as its own process
would give them (an uncaught exception: its traceback and exit 1). Tests that must see a fresh
process (what is imported before a refusal, how long it takes) use one process per command instead
(tests/test_preflight.py, tests/test_cli_help.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Lines no command prints: one opens each command's share of stdout and of stderr (with its index),
# the other closes its stderr share with its exit code.
MARK, EXIT = "@@rlexp-batch-command@@", "@@rlexp-batch-exit@@"

CHILD = r"""
import json, sys, traceback
from hydra.core.global_hydra import GlobalHydra
from rlexp.cli import main
MARK, EXIT = sys.argv[1:3]
for i, argv in enumerate(json.loads(sys.argv[3])):
    for stream in (sys.stdout, sys.stderr):
        print(f"{MARK} {i}", file=stream, flush=True)
    try:
        rc = main(argv)
    except SystemExit as e:  # what the interpreter would do with it
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        rc = 1 if isinstance(e.code, str) else (e.code or 0)
    except BaseException:
        traceback.print_exc()
        rc = 1
    GlobalHydra.instance().clear()  # a fresh process starts without one
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"{EXIT} {rc}", file=sys.stderr, flush=True)
"""


def _split(text: str, n: int) -> list[str]:
    """Each command's share of a stream: from the line opening it to the next one (or the end)."""
    found = list(re.finditer(rf"^{MARK} (\d+)\n", text, re.M))
    shares = {int(m[1]): text[m.end():nxt.start() if nxt else len(text)]
              for m, nxt in zip(found, [*found[1:], None])}
    return [shares.get(i, "") for i in range(n)]


def rlexp_each(commands: list[list[str]], *, cwd: Path | None = None,
               env: dict[str, str] | None = None,
               timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Each `rlexp` argv in turn in one child; a CompletedProcess each (args `rlexp ARGV`)."""
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONPATH", str(REPO))
    p = subprocess.run([sys.executable, "-c", CHILD, MARK, EXIT, json.dumps(commands)],
                       cwd=cwd or REPO, env=env, capture_output=True, text=True, timeout=timeout)
    done = []
    for argv, out, err in zip(commands, _split(p.stdout, len(commands)),
                              _split(p.stderr, len(commands))):
        ended = re.search(rf"^{EXIT} (-?\d+)\n\Z", err, re.M)
        if ended:  # its own exit code
            rc, err = int(ended[1]), err[:ended.start()]
        else:  # the child died inside it, or never reached it: the child's code and its last words
            rc, err = p.returncode or 1, err or p.stderr[-4000:]
        done.append(subprocess.CompletedProcess(["rlexp", *argv], rc, out, err))
    return done
