#!/usr/bin/env python3
"""Static import graph of the `rlexp` package: edges, package coupling, cycles.

Reads every module under `<root>/rlexp/` with `ast` (nothing is imported or executed) and records
each import of an `rlexp.*` module:

* relative imports are resolved against the importing module's package;
* `from rlexp.x import y` is an edge to `rlexp.x.y` when `y` is a submodule, else to `rlexp.x`;
* an import inside a function or method (at any depth) is tagged `function`, one executed when the
  module is imported (top level, class bodies, `if`/`try` blocks) is tagged `top`, and one inside an
  `if TYPE_CHECKING:` block is tagged `type` (type-only: listed, but left out of cycles);
* only the named module is an edge; the packages above it (whose `__init__` Python also runs) are
not,
  so that `pkg/__init__.py` re-exporting `pkg.sub` does not count as a cycle with every `pkg.sub`.

Dynamic imports (`importlib.import_module("rlexp.x")`) are not seen.

Output is plain text that reads as markdown: counts, the cycles of the module graph (strongly
connected components of size > 1, top-level and function-level imports alike: a function-level
import still couples two modules), the package cycles (each first component below rlexp is a node:
rlexp.models, rlexp.run.launcher, ...), the imports that run up a layer (`LAYERS`, the Layers table
of docs/DESIGN.md: types and config < components < orchestration < entry points), the edges among a
focus set, and, with `--dot FILE`, the package graph in Graphviz DOT. `--check` exits 1 when any
cycle runs through a module of the focus set, when packages form a cycle, or when an import runs up
a layer and is not in `ALLOWED_UPWARD`.

    python scripts/import_graph.py [--root REPO] [--focus rlexp.run.launcher rlexp.config ...]
    [--dot g.dot] [--check]
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

PKG = "rlexp"
DEFAULT_FOCUS = [
    "rlexp.run.launcher",
    "rlexp.run.controller",
    "rlexp.train",
    "rlexp.config",
    "rlexp.run.prepare",
    "rlexp.run.checkpoints",
    "rlexp.algorithm.loop",
    "rlexp.core.services",
]
# the strongest occurrence of an edge names its kind
KIND_RANK = {"top": 0, "function": 1, "type": 2}

# Layers of docs/DESIGN.md (its Layers table), lowest first; a module belongs to the longest prefix
# listed. Imports may point down or sideways, never up. `rlexp` itself (the package's __init__) has
# no layer.
LAYER_NAMES = ("types and config", "core", "components", "orchestration", "entry points")
LAYERS: dict[str, int] = {
    **dict.fromkeys(["rlexp.types", "rlexp.errors", "rlexp.config", "rlexp.registry"], 0),
    "rlexp.core": 1,
    **dict.fromkeys(
        [
            "rlexp.algorithm",
            "rlexp.actors",
            "rlexp.cluster",
            "rlexp.envs",
            "rlexp.evals",
            "rlexp.models",
            "rlexp.rewards",
            "rlexp.tracking",
            "rlexp.transport",
        ],
        2,
    ),
    "rlexp.run": 3,
    **dict.fromkeys(
        [
            "rlexp.cli",
            "rlexp.__main__",
            "rlexp.train",
            "rlexp.bench",
            "rlexp.evals.cli",
            "rlexp.cluster.plan_cli",
            "rlexp.cluster.doctor",
            "rlexp.tracking.compare",
            "rlexp.tracking.sweep_summary",
            "rlexp.tracking.reproduce",
        ],
        4,
    ),
}
# Upward imports known today, each to be removed by the change that owns its module; `--check` fails
# on any other. Stale entries (the import is gone) are reported, not failed, so removing one never
# breaks the check.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


@dataclass
class Graph:
    modules: dict[str, Path]                                    # module name -> file
    edges: dict[tuple[str, str], str] = field(default_factory=dict)  # (importer, imported) -> kind
    lines: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, src: str, dst: str, kind: str, line: int) -> None:
        if src == dst:
            return
        old = self.edges.get((src, dst))
        if old is None or KIND_RANK[kind] < KIND_RANK[old]:
            self.edges[(src, dst)] = kind
        self.lines.setdefault((src, dst), []).append(line)

    def coupling(self, include_type: bool = False) -> dict[str, set[str]]:
        """Adjacency of the module graph used for cycles (type-only imports left out unless
        asked)."""
        adj: dict[str, set[str]] = {m: set() for m in self.modules}
        for (a, b), kind in self.edges.items():
            if include_type or kind != "type":
                adj[a].add(b)
        return adj


# ----------------------------------------------------------------------------------------------
# parsing


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover(root: Path) -> dict[str, Path]:
    pkg_dir = root / PKG
    if not pkg_dir.is_dir():
        raise SystemExit(f"import_graph: no {PKG}/ package under {root}")
    return {module_name(root, p): p for p in sorted(pkg_dir.rglob("*.py"))
            if "__pycache__" not in p.parts}


def is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


class _Visitor(ast.NodeVisitor):
    def __init__(self, graph: Graph, module: str, is_package: bool) -> None:
        self.graph, self.module = graph, module
        self.package = module if is_package else module.rpartition(".")[0]
        self.func_depth = 0
        self.type_depth = 0

    # context --------------------------------------------------------------------------------------
    def _in_function(self, node: ast.AST) -> None:
        self.func_depth += 1
        self.generic_visit(node)
        self.func_depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _in_function

    def visit_If(self, node: ast.If) -> None:
        if is_type_checking(node.test):
            self.visit(node.test)
            self.type_depth += 1
            for stmt in node.body:
                self.visit(stmt)
            self.type_depth -= 1
            for stmt in node.orelse:  # the `else:` of `if TYPE_CHECKING:` runs for real
                self.visit(stmt)
        else:
            self.generic_visit(node)

    def _kind(self) -> str:
        if self.type_depth:
            return "type"
        return "function" if self.func_depth else "top"

    # imports --------------------------------------------------------------------------------------
    def _target(self, name: str) -> str | None:
        """The longest known module that `name` names (or lies in); None outside rlexp."""
        if name != PKG and not name.startswith(PKG + "."):
            return None
        while name and name not in self.graph.modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            target = self._target(alias.name)
            if target:
                self.graph.add(self.module, target, self._kind(), node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".") if self.package else []
            if node.level - 1 > len(base):
                self.graph.errors.append(
                    f"{self.module}:{node.lineno}: relative import beyond top level"
                )
                return
            base = base[: len(base) - (node.level - 1)]
            if node.module:
                base += node.module.split(".")
            source = ".".join(base)
        else:
            source = node.module or ""
        if source != PKG and not source.startswith(PKG + "."):
            return
        kind = self._kind()
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if alias.name != "*" and sub in self.graph.modules:
                self.graph.add(self.module, sub, kind, node.lineno)
            else:
                target = self._target(source)
                if target:
                    self.graph.add(self.module, target, kind, node.lineno)


def build_graph(root: Path) -> Graph:
    graph = Graph(modules=discover(root))
    for name, path in graph.modules.items():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError as e:
            graph.errors.append(f"{name}: syntax error: {e}")
            continue
        _Visitor(graph, name, path.name == "__init__.py").visit(tree)
    return graph


# -----------------------------------------------------------------------------------------------
# graphs


def package_of(module: str) -> str:
    """First component below rlexp: rlexp.tracking.base -> rlexp.tracking; rlexp itself stays
    rlexp."""
    parts = module.split(".")
    return ".".join(parts[:2])


def strongly_connected(adj: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative). Components in a deterministic order, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(adj):
        if start in index:
            continue
        work = [(start, iter(sorted(adj[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(adj.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                out.append(sorted(comp))
    return sorted(out, key=lambda c: (-len(c), c))


def cycles(adj: dict[str, set[str]]) -> list[list[str]]:
    return [c for c in strongly_connected(adj) if len(c) > 1]


def example_cycle(adj: dict[str, set[str]], component: list[str]) -> list[str]:
    """Shortest cycle through the component's first node, staying inside the component."""
    members = set(component)
    start = component[0]
    parent: dict[str, str] = {}
    queue = deque([start])
    seen = {start}
    while queue:
        node = queue.popleft()
        for nxt in sorted(adj[node] & members):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if nxt not in seen:
                seen.add(nxt)
                parent[nxt] = node
                queue.append(nxt)
    return [start]  # unreachable for a real component


def package_edges(graph: Graph) -> dict[tuple[str, str], dict[str, int]]:
    """(package, package) -> {kind: number of module edges of that kind}."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for (a, b), kind in graph.edges.items():
        pa, pb = package_of(a), package_of(b)
        if pa != pb:
            counts = out.setdefault((pa, pb), {})
            counts[kind] = counts.get(kind, 0) + 1
    return out


def package_kind(counts: dict[str, int]) -> str:
    return min(counts, key=KIND_RANK.__getitem__)


def layer_of(module: str) -> int | None:
    """The layer of the longest `LAYERS` prefix naming `module` (None: unlayered, e.g. the package
    itself)."""
    name = module
    while name:
        if name in LAYERS:
            return LAYERS[name]
        name = name.rpartition(".")[0]
    return None


def upward_edges(graph: Graph) -> list[tuple[str, str]]:
    """Imports (top-level or function-level; type-only ones left out) from a lower layer to a higher
    one."""
    out = []
    for (a, b), kind in graph.edges.items():
        la, lb = layer_of(a), layer_of(b)
        if kind != "type" and la is not None and lb is not None and la < lb:
            out.append((a, b))
    return sorted(out)


def in_focus(module: str, focus: list[str]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in focus)


# -----------------------------------------------------------------------------------------------
# report


def fmt_cycle(path: list[str], graph: Graph) -> str:
    steps = [path[0]]
    for a, b in pairwise(path):
        steps.append(f"-[{graph.edges[(a, b)]}]-> {b}")
    return " ".join(steps)


def report(graph: Graph, focus: list[str], root: Path) -> tuple[str, list[str]]:
    """The text report, and what `--check` fails on (one line each)."""
    kinds = {k: sum(1 for v in graph.edges.values() if v == k) for k in KIND_RANK}
    pkgs = sorted({package_of(m) for m in graph.modules})
    pedges = package_edges(graph)
    pkinds = {k: sum(1 for c in pedges.values() if package_kind(c) == k) for k in KIND_RANK}
    adj = graph.coupling()
    mod_cycles = cycles(adj)
    padj: dict[str, set[str]] = {p: set() for p in pkgs}
    for (a, b), c in pedges.items():
        if package_kind(c) != "type":
            padj[a].add(b)
    pkg_cycles = cycles(padj)
    focus_cycles = [c for c in mod_cycles if any(in_focus(m, focus) for m in c)]
    upward = upward_edges(graph)
    disallowed = [e for e in upward if e not in ALLOWED_UPWARD]
    stale = sorted(e for e in ALLOWED_UPWARD if e not in upward)

    L: list[str] = [f"# Import graph of `{PKG}` ({root})", ""]
    L += [
        "Edge kinds: `top` = runs when the module is imported; `function` = inside a "
        "function/method (a deferred import, still a coupling); `type` = under `if "
        "TYPE_CHECKING:` (ignored for cycles).",
        "",
    ]
    L += ["## Counts", ""]
    L.append(f"- modules: {len(graph.modules)} in {len(pkgs)} packages")
    L.append(
        f"- module edges: {len(graph.edges)} ({kinds['top']} top-level, {kinds['function']} "
        f"function-level, {kinds['type']} type-only)"
    )
    L.append(
        f"- package edges: {len(pedges)} ({pkinds['top']} with a top-level "
        f"import, {pkinds['function']} only function-level, {pkinds['type']} only type-only)"
    )
    L.append(
        f"- module cycles (SCCs > 1): {len(mod_cycles)}, covering {sum(map(len, mod_cycles))} "
        f"modules; through the focus set: {len(focus_cycles)}"
    )
    L.append(f"- package cycles (SCCs > 1): {len(pkg_cycles)}")
    L.append(
        "- upward imports (a layer importing a higher one): "
        f"{len(upward)}, {len(upward) - len(disallowed)} of them allowed "
        f"(ALLOWED_UPWARD: {len(ALLOWED_UPWARD)} entries)"
    )
    for err in graph.errors:
        L.append(f"- warning: {err}")
    L.append("")

    L += ["## Module cycles", ""]
    if not mod_cycles:
        L.append("none")
    for i, comp in enumerate(mod_cycles, 1):
        L.append(f"{i}. {len(comp)} modules: {', '.join(comp)}")
        L.append(f"   - e.g. {fmt_cycle(example_cycle(adj, comp), graph)}")
        inner = sorted(
            (a, b) for (a, b), k in graph.edges.items() if a in comp and b in comp and k != "type"
        )
        L.append(
            "   - edges inside: "
            + "; ".join(f"{a} -> {b} ({graph.edges[(a, b)]})" for a, b in inner)
        )
    L.append("")

    L += ["## Package cycles", ""]
    if not pkg_cycles:
        L.append("none")
    for i, comp in enumerate(pkg_cycles, 1):
        path = example_cycle(padj, comp)
        L.append(f"{i}. {len(comp)} packages: {', '.join(comp)}")
        L.append("   - e.g. " + " -> ".join(path))
    L.append("")

    L += ["## Upward imports", "", f"layers, lowest first: {', '.join(LAYER_NAMES)}", ""]
    if not upward:
        L.append("none")
    for a, b in upward:
        lines = ",".join(map(str, sorted(set(graph.lines[(a, b)]))))
        note = f"allowed: {ALLOWED_UPWARD[(a, b)]}" if (a, b) in ALLOWED_UPWARD else "NOT ALLOWED"
        L.append(
            f"- {a} ({LAYER_NAMES[layer_of(a)]}) "  # type: ignore[index]
            f"-> {b} ({LAYER_NAMES[layer_of(b)]}), "  # type: ignore[index]
            f"{graph.edges[(a, b)]} line {lines}: {note}"
        )
    for a, b in stale:
        L.append(f"- stale allow-list entry (no such import now; remove it): {a} -> {b}")
    L.append("")

    L += [
        "## Package edges",
        "",
        "`a -> b: N top, M function` (module edges behind each package edge)",
        "",
    ]
    for (a, b) in sorted(pedges):
        c = pedges[(a, b)]
        L.append(f"- {a} -> {b}: " + ", ".join(f"{c[k]} {k}" for k in KIND_RANK if k in c))
    L.append("")

    fmods = sorted(m for m in graph.modules if in_focus(m, focus))
    missing = [f for f in focus if not any(in_focus(m, [f]) for m in graph.modules)]
    L += [f"## Focus set: {' '.join(focus)}", ""]
    L.append(f"modules: {', '.join(fmods) or 'none'}")
    if missing:
        L.append(f"not present: {', '.join(missing)}")
    L.append("")
    fedges = sorted((a, b) for (a, b) in graph.edges if a in fmods and b in fmods)
    L.append(f"edges among them ({len(fedges)}):")
    L.append("")
    for a, b in fedges:
        lines = ",".join(map(str, sorted(set(graph.lines[(a, b)]))))
        L.append(f"- {a} -> {b} ({graph.edges[(a, b)]}) line {lines}")
    L.append("")
    L.append(f"cycles through the focus set: {len(focus_cycles) or 'none'}")
    for comp in focus_cycles:
        L.append(f"- {', '.join(comp)}")
        L.append(f"  - e.g. {fmt_cycle(example_cycle(adj, comp), graph)}")
    L.append("")

    L += ["## Edges out of each module", ""]
    for m in sorted(graph.modules):
        outs = sorted(b for (a, b) in graph.edges if a == m)
        if outs:
            L.append(f"- {m}: " + ", ".join(f"{b} ({graph.edges[(m, b)][0]})" for b in outs))
    L.append("")
    failures = [f"import cycle through the focus set: {', '.join(c)}" for c in focus_cycles]
    failures += [f"package cycle: {' -> '.join(example_cycle(padj, c))}" for c in pkg_cycles]
    failures += [
        f"upward import: {a} ({LAYER_NAMES[layer_of(a)]}) "  # type: ignore[index]
        f"-> {b} ({LAYER_NAMES[layer_of(b)]})"  # type: ignore[index]
        for a, b in disallowed
    ]
    return "\n".join(L), failures


def to_dot(graph: Graph) -> str:
    pedges = package_edges(graph)
    pkgs = sorted({package_of(m) for m in graph.modules})
    padj: dict[str, set[str]] = {p: set() for p in pkgs}
    for (a, b), c in pedges.items():
        if package_kind(c) != "type":
            padj[a].add(b)
    in_cycle = {p for comp in cycles(padj) for p in comp}
    comp_of = {p: i for i, comp in enumerate(cycles(padj)) for p in comp}
    out = ["digraph rlexp {", "  rankdir=LR;", '  node [shape=box, fontname="Helvetica"];']
    for p in pkgs:
        n = sum(1 for m in graph.modules if package_of(m) == p)
        attrs = f'label="{p}\\n{n} module{"s" * (n != 1)}"'
        if p in in_cycle:
            attrs += ", color=red"
        out.append(f'  "{p}" [{attrs}];')
    for (a, b) in sorted(pedges):
        c = pedges[(a, b)]
        kind = package_kind(c)
        style = {"top": "solid", "function": "dashed", "type": "dotted"}[kind]
        attrs = [f'style={style}', f'label="{sum(c.values())}"']
        if a in comp_of and comp_of.get(a) == comp_of.get(b) and kind != "type":
            attrs.append("color=red")
        out.append(f'  "{a}" -> "{b}" [{", ".join(attrs)}];')
    out.append("}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="repository root holding rlexp/ (default: the repo of this script)")
    ap.add_argument("--focus", nargs="+", default=DEFAULT_FOCUS,
                    help="modules or packages (a package stands for every module under it)")
    ap.add_argument("--dot", type=Path, help="write the package graph as Graphviz DOT to this file")
    ap.add_argument(
        "--check",
        action="store_true",
        help="exit 1 on an import cycle through the focus set, a package "
        "cycle, or an upward import not in ALLOWED_UPWARD",
    )
    args = ap.parse_args(argv)

    root = args.root.resolve()
    graph = build_graph(root)
    text, failures = report(graph, args.focus, root)
    print(text)
    if args.dot:
        args.dot.write_text(to_dot(graph))
    if args.check and failures:
        for f in failures:
            print(f"import_graph: {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
