"""How a run names what it was configured with in its start-up lines: the user's own choice (`reward=verifier_mean`),
not the class it resolves to (`weaver` with `combine: mean`), which follows in brackets when it differs."""
from __future__ import annotations

import contextlib
from typing import Any


def chosen(group: str) -> str | None:
    """The option the user picked for `group` (Hydra's runtime choices), or None outside a Hydra run."""
    with contextlib.suppress(Exception):  # no Hydra app running (a script, a test): nothing was chosen
        from hydra.core.hydra_config import HydraConfig

        choice = HydraConfig.get().runtime.choices.get(group)
        return str(choice) if choice else None
    return None


def reward_label(reward: Any, choice: str | None = None) -> str:
    """`reward=verifier_mean (weaver, combine=mean)`: the option as chosen, then the class and the options
    that make it differ, when the option's name is not the class's."""
    choice = choice if choice is not None else chosen("reward")
    name = str(reward.name)
    if not choice or choice == name:
        return f"reward={name}"
    opts = dict(getattr(reward, "options", None) or {})
    shown = ", ".join(f"{k}={opts[k]}" for k in ("combine", "mode", "kind") if k in opts)
    return f"reward={choice} ({name}{', ' + shown if shown else ''})"
