"""Where the launcher's config goes, followed statically through the calls it is passed to (issue 44
item 2).

    python scripts/cfg_trace.py [--root REPO] [--start rlexp.run.launcher:run] [--param cfg]
    [--list]

Starting at `run(cfg)` in rlexp/run/launcher.py, every call one of whose arguments mentions the
config (the parameter, or a name assigned from an expression that mentions it: `p = prepare(cfg)`,
`c = p.cfg`) is followed into the function it names, when that function is rlexp's and `ast` can
resolve it: a module-level function or class (its `__init__`) named directly, through an import or a
module alias, or a method called on `self`. Nothing is imported. Each function is entered once,
depth first, in the order of its calls.

Three traces: the composed DictConfig only (a call that returns the typed config or a `Prepared`
ends it), the whole config in either form (`p.cfg` too; a sub-config such as `cfg.cluster` ends it),
and any part of it. Counted: the modules the trace enters, and its climbs: the times the next module
it enters (a call into another module) is on a higher layer than the one entered before it
(scripts/import_graph.py's LAYERS, the Layers table of docs/DESIGN.md). A climb is the trace coming
back up after going down into a lower layer and then down again elsewhere: planner -> config.reward
-> catalog is one. A config that is cut into typed sub-configs at the top and handed down whole
climbs less. The count is a static approximation (calls on objects other than `self` are not
followed), the same for any tree it is run on, so before/after compare.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path


def _layers(root: Path, script: Path | None = None):
    spec = importlib.util.spec_from_file_location(
        "_import_graph", script or root / "scripts" / "import_graph.py"
    )
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["_import_graph"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.layer_of


@dataclass
class Module:
    name: str
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level functions and classes
    names: dict[str, tuple[str, str | None]] = field(
        default_factory=dict
    )  # alias -> (module, attr | None)


def load(root: Path) -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for f in sorted((root / "rlexp").rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        m = Module(".".join(parts), ast.parse(f.read_text()))
        package = m.name if f.name == "__init__.py" else m.name.rpartition(".")[0]
        for n in m.tree.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                m.defs[n.name] = n
        for n in ast.walk(m.tree):
            if isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    up = package.split(".")[: len(package.split(".")) - n.level + 1]
                    base = ".".join([*up, base] if base else up)
                for a in n.names:
                    m.names[a.asname or a.name] = (base, a.name)
            elif isinstance(n, ast.Import):
                for a in n.names:
                    m.names[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0],
                        None,
                    )
        mods[m.name] = m
    return mods


def resolve(
    mods: dict[str, Module], module: str, name: str, depth: int = 0
) -> tuple[str, ast.AST] | None:
    """The rlexp function or class `name` means in `module` (following re-exports a few steps)."""
    m = mods.get(module)
    if m is None or depth > 4:
        return None
    if name in m.defs:
        return module, m.defs[name]
    if name in m.names:
        target, attr = m.names[name]
        if attr is None or f"{target}.{attr}" in mods:
            return None  # a module, not a function
        return resolve(mods, target, attr, depth + 1)
    return None


def module_alias(mods: dict[str, Module], module: str, name: str) -> str | None:
    target, attr = mods[module].names.get(name, ("", ""))
    full = f"{target}.{attr}" if attr else target
    return full if full in mods else None


# Attributes that hold the whole config (`Prepared.cfg`, `self.c`), and the return types that do
HOLDERS = frozenset({"cfg", "c", "t", "config", "typed"})
CONFIG_TYPES = ("TrainConfig", "Prepared", "DictConfig")


class Trace:
    """`whole`: follow only the whole config (a sub-config such as `cfg.cluster` ends the trace
    there); else any expression that mentions it."""

    def __init__(self, mods: dict[str, Module], whole: bool = True, composed: bool = False) -> None:
        self.mods, self.whole = mods, whole
        # `composed`: only the DictConfig Hydra composed (a typed config made from it ends the
        # trace)
        self.holders, self.types = (
            (frozenset(), ("DictConfig",)) if composed else (HOLDERS, CONFIG_TYPES)
        )
        self.self_attrs: set[tuple[str, str]] = set()  # (class, attribute) assigned the config
        self.seen: set[tuple[str, str]] = set()
        self.entered: list[
            str
        ] = []  # modules, in the order calls enter them (calls across modules only)

    def enter(
        self,
        module: str,
        fn: ast.AST,
        tainted_params: set[str],
        cls: ast.ClassDef | None,
        qual: str,
    ) -> None:
        if (module, qual) in self.seen:
            return
        self.seen.add((module, qual))
        tainted = set(tainted_params)
        body = fn.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        for _ in range(
            2
        ):  # assignments after the calls that use them: two passes reach the fixpoint here
            for n in [x for s in body for x in ast.walk(s)]:
                self._assign(n, tainted, cls, module)
        for n in [x for s in body for x in ast.walk(s)]:
            if isinstance(n, ast.Call) and any(
                self._mentions(a, tainted, cls, module)
                for a in [*n.args, *(k.value for k in n.keywords)]
            ):
                self._follow(module, n, tainted, cls)

    def _mentions(
        self, e: ast.AST, tainted: set[str], cls: ast.ClassDef | None = None, module: str = ""
    ) -> bool:
        if not self.whole:
            return any(isinstance(x, ast.Name) and x.id in tainted for x in ast.walk(e))
        if isinstance(e, ast.Name):
            return e.id in tainted
        if isinstance(e, ast.Attribute):
            if isinstance(e.value, ast.Name) and e.value.id == "self" and cls is not None:
                return (cls.name, e.attr) in self.self_attrs
            return e.attr in self.holders and self._mentions(e.value, tainted, cls, module)
        if isinstance(e, ast.Call) and any(self._mentions(a, tainted, cls, module) for a in e.args):
            target = self._target(module, e, cls)[0] if module else None
            if (
                target is None
            ):  # a copy or a conversion (deepcopy, OmegaConf.to_object): still the config
                return True
            returns = getattr(target[1], "returns", None)
            return returns is not None and any(t in ast.unparse(returns) for t in self.types)
        return False

    def _assign(self, n: ast.AST, tainted: set[str], cls: ast.ClassDef | None, module: str) -> None:
        pairs: list[tuple[list[ast.AST], ast.AST]] = []
        if isinstance(n, ast.Assign):
            pairs.append((list(n.targets), n.value))
        elif isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
            pairs.append(([n.target], n.value))
        elif isinstance(n, (ast.For, ast.comprehension)):
            pairs.append(([n.target], n.iter))
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            pairs.append(([n.optional_vars], n.context_expr))
        for targets, value in pairs:
            if self._mentions(value, tainted, cls, module):
                for t in targets:
                    tainted.update(
                        x.id for x in ast.walk(t) if isinstance(x, ast.Name) and x.id != "self"
                    )
                    if (
                        cls is not None
                        and isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                    ):
                        self.self_attrs.add((cls.name, t.attr))

    def _target(
        self, module: str, call: ast.Call, cls: ast.ClassDef | None
    ) -> tuple[tuple[str, ast.AST] | None, bool]:
        """The rlexp function or class a call names, and whether it is a method called on `self`."""
        f, target, self_call = call.func, None, False
        if isinstance(f, ast.Name):
            target = resolve(self.mods, module, f.id)
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id == "self" and cls is not None:
                meth = next(
                    (b for b in cls.body if isinstance(b, ast.FunctionDef) and b.name == f.attr),
                    None,
                )
                target, self_call = ((module, meth) if meth else None), True
            elif (alias := module_alias(self.mods, module, f.value.id)) is not None:
                target = resolve(self.mods, alias, f.attr)
        return target, self_call

    def _follow(
        self, module: str, call: ast.Call, tainted: set[str], cls: ast.ClassDef | None
    ) -> None:
        target, self_call = self._target(module, call, cls)
        if target is None:
            return
        where, fn = target
        owner = cls if self_call else None
        qual = getattr(fn, "name", "?")
        if isinstance(fn, ast.ClassDef):
            owner, qual = fn, f"{fn.name}.__init__"
            fn = next(
                (b for b in fn.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), fn
            )
        elif self_call and cls is not None:
            qual = f"{cls.name}.{qual}"
        params: set[str] = set()
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            if args and args[0] in ("self", "cls") and (owner is not None):
                args = args[1:]
            for i, a in enumerate(call.args):
                if i < len(args) and self._mentions(a, tainted, cls, module):
                    params.add(args[i])
            params |= {
                k.arg
                for k in call.keywords
                if k.arg and self._mentions(k.value, tainted, cls, module)
            }
        if where != module:
            self.entered.append(where)
        self.enter(where, fn, params, owner, qual)


def trace(
    root: Path,
    start: str = "rlexp.run.launcher:run",
    param: str = "cfg",
    whole: bool = True,
    composed: bool = False,
) -> list[str]:
    mods = load(root)
    module, name = start.split(":")
    fn = mods[module].defs[name]
    t = Trace(mods, whole, composed)
    t.entered.append(module)
    t.enter(module, fn, {param}, None, name)
    return t.entered


def climbs(entered: list[str], layer_of) -> list[tuple[str, str]]:
    out = []
    for a, b in itertools.pairwise(entered):
        la, lb = layer_of(a), layer_of(b)
        if la is not None and lb is not None and lb > la:
            out.append((a, b))
    return out


def measure(root: Path, script: Path | None = None) -> dict[str, object]:
    layer_of, out = _layers(root, script), {}
    for whole, composed, what in (
        (True, True, "the composed DictConfig"),
        (True, False, "the whole config"),
        (False, False, "any part of it"),
    ):
        entered = trace(root, whole=whole, composed=composed)
        out[f"cfg trace ({what}): modules entered"] = len(set(entered))
        out[f"cfg trace ({what}): climbs to a higher layer"] = len(climbs(entered, layer_of))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--start", default="rlexp.run.launcher:run")
    ap.add_argument("--param", default="cfg")
    ap.add_argument(
        "--any", action="store_true", help="follow any part of the config, not only the whole"
    )
    ap.add_argument("--composed", action="store_true", help="follow only the composed DictConfig")
    ap.add_argument(
        "--list", action="store_true", help="print the modules in the order entered, and the climbs"
    )
    a = ap.parse_args()
    entered = trace(a.root, a.start, a.param, whole=not a.any, composed=a.composed)
    up = climbs(entered, _layers(a.root))
    if a.list:
        print("\n".join(entered))
        print("\nclimbs:\n" + "\n".join(f"  {x} -> {y}" for x, y in up))
    print(f"modules entered: {len(set(entered))}\nclimbs to a higher layer: {len(up)}")


if __name__ == "__main__":
    main()
