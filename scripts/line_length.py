"""A ratchet on lines over 100 characters: new and moved code stays within 100, old code only
gets shorter.

ruff allows 120 (the old code's limit); the team's rule for new and moved code is 100. The
committed baseline `.ci/long_lines.txt` holds, per Python file, how many of its lines are longer
than 100 characters today. tests/test_line_length.py fails when a file's count grows or a file
missing from the baseline has any.

    python scripts/line_length.py           check (what the test runs): exit 1 naming each file
                                            that grew
    python scripts/line_length.py --lower   after wrapping lines: write the counts that fell
                                            (never raises one); commit .ci/long_lines.txt
    python scripts/line_length.py --accept  write today's counts, raises included: only for a
                                            file git records as moved (its lines were reviewed)
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / ".ci" / "long_lines.txt"
LIMIT = 100
_SKIP = {".venv", "build", "dist", "__pycache__", "node_modules"}


def python_files(root: Path = REPO) -> list[str]:
    """The repository's Python files (tracked, or new and not ignored), relative to `root`."""
    cmd = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"]
    try:
        out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True).stdout
        return sorted({p for p in out.splitlines() if (root / p).is_file()})
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist): walk the tree
        rels = (p.relative_to(root) for p in root.rglob("*.py"))
        return sorted(str(r) for r in rels
                      if not _SKIP.intersection(r.parts) and not r.parts[0].startswith("."))


def long_lines(path: Path) -> int:
    text = path.read_text(encoding="utf-8", errors="replace")
    return sum(1 for line in text.splitlines() if len(line) > LIMIT)


def current(root: Path = REPO) -> dict[str, int]:
    return {rel: n for rel in python_files(root) if (n := long_lines(root / rel))}


def read_baseline(path: Path = BASELINE) -> dict[str, int]:
    counts: dict[str, int] = {}
    if not path.is_file():  # no baseline: every long line counts (`--accept` writes the first one)
        return counts
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            n, rel = line.split(maxsplit=1)
            counts[rel] = int(n)
    return counts


def write_baseline(counts: dict[str, int], path: Path = BASELINE) -> None:
    head = (f"# Lines over {LIMIT} characters per file (scripts/line_length.py).\n"
            "# Counts may only fall; a file not listed has none.\n")
    body = "".join(f"{n} {rel}\n" for rel, n in sorted(counts.items()) if n)
    path.write_text(head + body, encoding="utf-8")


def grown(now: dict[str, int], base: dict[str, int]) -> list[str]:
    """Every file whose count is above its baseline (a new file's baseline is 0)."""
    return [f"{rel}: {n} lines over {LIMIT} characters, baseline {base.get(rel, 0)}"
            for rel, n in sorted(now.items()) if n > base.get(rel, 0)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--lower", action="store_true",
                      help="write the counts that fell (never raises one)")
    mode.add_argument("--accept", action="store_true",
                      help="write today's counts, raises included (a moved file)")
    args = ap.parse_args(argv)
    now, base = current(), read_baseline()
    if args.accept:
        write_baseline(now)
        return 0
    if args.lower:
        write_baseline({rel: min(n, base.get(rel, 0)) for rel, n in now.items()})
    bad = grown(now, base)
    if bad:
        print(f"{len(bad)} files have more lines over {LIMIT} characters than .ci/long_lines.txt "
              "allows; wrap them (new and moved code stays within 100):\n  " + "\n  ".join(bad),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
