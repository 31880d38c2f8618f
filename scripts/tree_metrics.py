"""How the package's tree reads, counted (issue 21's before/after): modules at the rlexp/ root, longest functions,
`cfg`/`c` parameters typed `Any`, and (through scripts/import_graph.py) upward imports and package
cycles. Issue 44 adds: config parameters typed `Any` by any of their names, one-letter parameters
(their share of all), modules over 500 lines, functions over 80, and (scripts/cfg_trace.py) where
the launcher's config goes.

    python scripts/tree_metrics.py [--root REPO] [--import-graph SCRIPT]

Parses with `ast`; nothing is imported. `--import-graph` names the layer checker whose LAYERS
describe that tree (an older commit's own scripts/import_graph.py for an older tree)."""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

# Names a config parameter goes by (the typed config, the composed one, or a group of either)
CONFIG_NAMES = ("cfg", "c", "t", "config", "typed", "composed")


def count(root: Path) -> dict[str, object]:
    pkg = root / "rlexp"
    lengths: list[tuple[int, str]] = []
    any_cfg = any_config = params = one_letter = 0
    long_modules = []
    for f in sorted(pkg.rglob("*.py")):
        text = f.read_text()
        if text.count("\n") > 500:
            long_modules.append(f"{f.relative_to(root)} ({text.count(chr(10))})")
        for n in ast.walk(ast.parse(text)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lengths.append((n.end_lineno - n.lineno + 1, f"{f.relative_to(root)}:{n.name}"))
                args = n.args.posonlyargs + n.args.args + n.args.kwonlyargs
                typed_any = [a.arg for a in args
                             if a.annotation is not None and ast.unparse(a.annotation) == "Any"]
                any_cfg += sum(1 for a in typed_any if a in ("cfg", "c"))
                any_config += sum(1 for a in typed_any if a in CONFIG_NAMES or a.endswith("_cfg"))
                named = [a.arg for a in args if a.arg not in ("self", "cls")]
                params += len(named)
                one_letter += sum(1 for a in named if len(a) == 1)
    lengths.sort(reverse=True)
    return {"root modules": len(list(pkg.glob("*.py"))),
            "subpackages": sum(1 for d in pkg.iterdir() if (d / "__init__.py").exists()),
            "functions": len(lengths), "over 50 lines": sum(1 for n, _ in lengths if n > 50),
            "longest": ", ".join(f"{name} ({n})" for n, name in lengths[:3]),
            "cfg/c: Any parameters": any_cfg,
            f"config parameters typed Any ({', '.join(CONFIG_NAMES)}, *_cfg)": any_config,
            "one-letter parameters":
                f"{one_letter} of {params} ({100 * one_letter / max(1, params):.1f}%)",
            "modules over 500 lines": ", ".join(long_modules) or "none",
            "functions over 80 lines":
                ", ".join(f"{name} ({n})" for n, name in lengths if n > 80) or "none"}


def graph(root: Path, script: Path) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, str(script), "--root", str(root)], capture_output=True, text=True
    ).stdout
    found = {}
    for key, pat in (
        ("upward imports", r"upward imports \(a layer importing a higher one\): (\d+)"),
        ("package cycles", r"package cycles \(SCCs > 1\): (\d+)"),
        ("module cycles", r"module cycles \(SCCs > 1\): (\d+)"),
    ):
        m = re.search(pat, out)
        found[key] = m.group(1) if m else "?"
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--import-graph", type=Path, default=None)
    a = ap.parse_args()
    script = a.import_graph or a.root / "scripts" / "import_graph.py"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cfg_trace import measure

    for k, v in {**count(a.root), **graph(a.root, script), **measure(a.root, script)}.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
