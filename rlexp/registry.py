"""One registry type for everything a config names by string: environments, rewards, rule verifiers,
verifier kinds, weight transports, cluster job backends, trackers (docs/plugins.md: the contract,
one table per point).

A name is either a built-in (registered with `@REGISTRY.register("name")` when its module is
imported) or a Python import path `package.module:Class`, so a user's class can live outside rlexp
and still be picked from YAML or the command line. The path is imported on lookup, in whichever
process looks it up (the controller in `prepare`, then every actor: `rlexp.core.plugins` puts the
user's folders on their module path), and the class must be a subclass of the registry's kind. A
failed import or a class of the wrong kind is a `PluginError` naming the module, the error and the
folders searched, raised in `prepare` before anything is spawned.

Each entry is a class that declares, as class attributes, what it needs and what it can do (a reward
the verifiers it scores with, a transport its set-up and clean-up, a job backend its settings
dataclass), so code that orchestrates a run asks the entry (`Registry.having`) instead of naming a
built-in. A plug-in's options are a dataclass (`Options`/`Settings`), filled and checked by
`rlexp.config.validate.check_options`."""
from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from rlexp.config.validate import ConfigError

T = TypeVar("T", bound=type)

# Modules outside rlexp whose classes a lookup in this process returned (a `module:Class` name, or a
# name such a module registered), in lookup order: what the manifest describes and every actor
# imports.
IMPORTED: dict[str, None] = {}
# Of those, the modules found by a registered name rather than by import path: a re-run must list
# them in `plugins`.
BY_NAME: dict[str, None] = {}


class PluginError(ConfigError):
    """A plug-in named in config cannot be used: its module does not import, or it is not of the
    right kind."""


def _used(cls: type, kind: str, name: str, by_name: bool) -> None:
    """Record a class outside rlexp as used. One defined in the script that was run (`__main__`) is
    refused: the actor processes run another `__main__`, so they could never find it (the run would
    die in its first actor)."""
    module = cls.__module__
    if module == "__main__":
        file = getattr(sys.modules.get("__main__"), "__file__", None) or "the interactive session"
        raise PluginError(
            f"{kind} {name}: {cls.__qualname__} is defined in the script being run ({file}); "
            "rlexp's actor processes cannot import a script's own classes. Move it into a "
            f"module beside the script (e.g. tasks.py) and name it as tasks:{cls.__qualname__}, "
            "or import that module (plugins=[tasks])"
        )
    if module != "rlexp" and not module.startswith("rlexp."):
        IMPORTED[module] = None
        if by_name:
            BY_NAME[module] = None


def is_path(name: str) -> bool:
    """`package.module:Class` rather than a registered name."""
    return ":" in name


def import_module(module: str, who: str) -> object:
    """`module` imported, or a `PluginError` naming it, the error and `sys.path` (the usual
    cause)."""
    try:
        mod = importlib.import_module(module)
    # a plug-in's own import can fail any way; all of them mean "cannot use it"
    except Exception as e:
        raise PluginError(
            f"{who}: cannot import module {module!r} ({type(e).__name__}: {e}); searched sys.path "
            f"{[p for p in sys.path if p]}. Run from the folder that holds it, list its folder "
            f"in config_path (its parent is searched), or install it"
        ) from None
    return mod


class Registry(Generic[T]):
    """Names -> subclasses of `base`. `kind` and `hint` word the errors (`environment`, `reward`,
    ...). `registered_only`: a `package.module:Class` must be a class its module registered under a
    name (the kinds that are rebuilt by name in another process, a transport's receiver in a
    generator). `also`: words the config key accepts besides the entries (`auto`), listed first
    among the choices an error names."""

    def __init__(self, kind: str, base: T, hint: str, *, registered_only: bool = False,
                 also: tuple[str, ...] = ()) -> None:
        self.kind, self.base, self.hint = kind, base, hint
        self.registered_only, self.also = registered_only, also
        self._classes: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: `cls.name = name`, and `name` resolves to `cls`. A second class under a
        taken name is refused (two plug-ins silently replacing each other would change a run without
        a word)."""
        def deco(cls: T) -> T:
            old = self._classes.get(name)
            same = old is not None and (old.__module__, old.__qualname__) == (
                cls.__module__,
                cls.__qualname__,
            )
            if old is not None and old is not cls and not same:  # `same`: one module imported twice
                raise PluginError(f"{self.kind} name {name!r} is already registered by "
                                  f"{old.__module__}:{old.__qualname__}; register "
                                  f"{cls.__module__}:{cls.__qualname__} under another name")
            cls.name = name
            self._classes[name] = cls
            return cls

        return deco

    def names(self) -> list[str]:
        return sorted(self._classes)

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, class) of every registered entry, by name."""
        return iter(sorted(self._classes.items()))

    def having(self, capability: str) -> list[str]:
        """The registered names whose class declares `capability` (a class attribute) true: how
        orchestration asks for "every transport with a clean-up" or "the separable verifier kinds"
        without naming one."""
        return [n for n, cls in self.items() if getattr(cls, capability, False)]

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __getitem__(self, name: str) -> T:
        return self._classes[name]

    def find(self, name: str) -> T | None:
        """The class registered as `name`, or None: no import, nothing recorded (a cheap look before
        validation)."""
        return self._classes.get(name)

    def get(self, name: str) -> T:
        """The class `name` stands for: a registered name, or `package.module:Class` imported
        now."""
        name = str(name)
        if is_path(name):
            return self._by_path(name)
        if name not in self._classes:
            close = difflib.get_close_matches(name, [*self.also, *self._classes], n=3, cutoff=0.7)
            near = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
            choices = [*self.also, *self.names()]
            raise PluginError(f"unknown {self.kind} {name!r}; {near}choose one of {choices}, "
                              f"or name your own class as package.module:Class ({self.hint}) or "
                              f"register it by name in a module listed in `plugins`")
        cls = self._classes[name]
        # a user's module registered it: the actors need it too
        _used(cls, self.kind, repr(name), by_name=True)
        return cls

    def _by_path(self, name: str) -> T:
        module, _, attr = name.partition(":")
        cls = getattr(import_module(module, f"{self.kind} {name}"), attr, None)
        if cls is None:
            raise PluginError(f"{self.kind} {name}: module {module!r} has no attribute {attr!r}")
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PluginError(f"{self.kind} {name}: {attr} is {cls!r}, not a subclass of "
                              f"{self.base.__module__}.{self.base.__qualname__}")
        if self.registered_only and self._classes.get(getattr(cls, "name", "")) is not cls:
            raise PluginError(f"{self.kind} {name}: {attr} is not registered; decorate it with "
                              f"@<registry>.register(\"a_name\") ({self.hint})")
        _used(cls, self.kind, name, by_name=False)  # only used code: what the manifest records
        return cls  # type: ignore[return-value]
