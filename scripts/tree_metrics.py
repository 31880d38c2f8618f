"""How the package's tree reads, counted (issue 21's before/after): modules at the rlexp/ root, longest functions,
`cfg`/`c` parameters typed `Any`, and (through scripts/import_graph.py) upward imports and package cycles.

    python scripts/tree_metrics.py [--root REPO] [--import-graph SCRIPT]

Parses with `ast`; nothing is imported. `--import-graph` names the layer checker whose LAYERS describe that tree
(an older commit's own scripts/import_graph.py for an older tree)."""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path


def count(root: Path) -> dict[str, object]:
    pkg = root / "rlexp"
    lengths: list[tuple[int, str]] = []
    any_cfg = 0
    for f in sorted(pkg.rglob("*.py")):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths.append((n.end_lineno - n.lineno + 1, f"{f.relative_to(root)}:{n.name}"))
                any_cfg += sum(1 for a in n.args.args + n.args.kwonlyargs
                               if a.arg in ("cfg", "c") and a.annotation is not None
                               and ast.unparse(a.annotation) == "Any")
    lengths.sort(reverse=True)
    return {"root modules": len(list(pkg.glob("*.py"))),
            "subpackages": sum(1 for d in pkg.iterdir() if (d / "__init__.py").exists()),
            "functions": len(lengths), "over 50 lines": sum(1 for n, _ in lengths if n > 50),
            "longest": ", ".join(f"{name} ({n})" for n, name in lengths[:3]),
            "cfg/c: Any parameters": any_cfg}


def graph(root: Path, script: Path) -> dict[str, str]:
    out = subprocess.run([sys.executable, str(script), "--root", str(root)], capture_output=True, text=True).stdout
    found = {}
    for key, pat in (("upward imports", r"upward imports \(a layer importing a higher one\): (\d+)"),
                     ("package cycles", r"package cycles \(SCCs > 1\): (\d+)"),
                     ("module cycles", r"module cycles \(SCCs > 1\): (\d+)")):
        m = re.search(pat, out)
        found[key] = m.group(1) if m else "?"
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--import-graph", type=Path, default=None)
    a = ap.parse_args()
    script = a.import_graph or a.root / "scripts" / "import_graph.py"
    for k, v in {**count(a.root), **graph(a.root, script)}.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
