"""Imports every built-in environment so that `@register_env` runs. Add new modules here."""
from rlexp.envs import arithmetic  # noqa: F401
from rlexp.envs import calculator, gpqa, gsm8k, math_env, mmlu_pro  # noqa: F401
