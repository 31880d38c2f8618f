"""A run's inputs, loaded and checked without torch: the environment's samples, the benchmarks,
the reward and its verifiers' kinds, and the prompts and answers against the CPU character
tokenizer (a JSON file).

`rlexp train` runs these in `rlexp.run.preflight` before torch loads, so a missing dataset, a
reward that does not fit the task or a character outside the vocabulary costs a second and leaves
no run folder. `rlexp.run.prepare.prepare` runs them for every caller (a sweep's later jobs, the
Python API); what it loaded in preflight it takes over once (`load_inputs(keep=True)`), so a
dataset is not read twice. The model's files and every served verifier's checkpoint are found
and their headers checked here too (`rlexp.models.hf_files`, no torch). What needs torch stays in
`prepare`: the tiny model's checkpoint and the tiny verifier stand-ins (written or trained on first
use), and the prompt lengths of a Hugging Face tokenizer (loaded through `transformers`)."""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlexp.config.model import ModelConfig
from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import TrainConfig
from rlexp.config.suggest import option_naming
from rlexp.config.validate import ConfigError
from rlexp.envs.base import Environment
from rlexp.envs.registry import build_env
from rlexp.evals.benchmarks import load_benchmarks
from rlexp.models.hf_files import CheckpointError, find_checkpoint, validate_checkpoint
from rlexp.models.limits import LimitError, apply_limits, read_limits
from rlexp.models.tokenizer import ASSET, CHAR_TOKENIZER_FILE
from rlexp.rewards.base import Reward
from rlexp.rewards.registry import build_reward
from rlexp.rewards.verifiers.base import ServedVerifier
from rlexp.rewards.verifiers.kinds import supported_kinds, supports
from rlexp.rewards.verifiers.registry import verifier_checkpoint
from rlexp.types import Sample


@dataclass
class Inputs:
    """What a run reads before it starts: its environment with its data, the benchmarks, the
    reward."""

    env: Environment
    train: list[Sample]
    held: list[Sample]
    # eval.benchmarks: name -> (environment, max_tokens)
    benchmarks: dict[str, tuple[Environment, int]]
    reward: Reward


# Inputs preflight loaded, kept for the `prepare` of the same config in this process (taken once:
# a sweep's later job with the same environment builds its own, never one a run has used).
_KEPT: dict[str, Inputs] = {}


def _key(cfg: TrainConfig) -> str:
    return repr((cfg.environment, cfg.eval.benchmarks, cfg.reward, cfg.verifier_set, cfg.plugins,
                 cfg.config_path))


def load_inputs(cfg: TrainConfig, keep: bool = False) -> Inputs:
    """The environment built and its samples read, the benchmarks loaded, the reward built (unknown
    verifiers, bad options) and each verifier's kind checked against the environment; a bad input
    is one `ConfigError` naming the environment and the reward. Sets `cfg.reward.verifiers` to the
    verifiers the reward uses. `keep`: keep them for the next call with this config (a sweep's
    first job is checked by preflight and again in its own process: loaded once)."""
    key = _key(cfg)
    if (kept := _KEPT.get(key) if keep else _KEPT.pop(key, None)) is not None:
        cfg.reward.verifiers = list(cfg.reward.verifiers) or list(cfg.verifier_set.members)
        used = {v.name for v in kept.reward.verifiers}
        cfg.reward.verifiers = [v for v in cfg.reward.verifiers if v.name in used]
        return kept
    try:
        env = build_env(cfg.environment)
        train, held = env.train_samples(), env.eval_samples()
        benchmarks = load_benchmarks(list(cfg.eval.benchmarks))
        cfg.reward.verifiers = list(cfg.reward.verifiers) or list(cfg.verifier_set.members)
        # unknown verifiers, bad options: fail now, not in an actor
        reward = build_reward(cfg.reward, env)
        used = {v.name for v in reward.verifiers}
        cfg.reward.verifiers = [v for v in cfg.reward.verifiers if v.name in used]
        check_verifier_kinds(cfg, env)
    except (ValueError, FileNotFoundError) as e:  # a bad environment/reward/benchmark: one line
        raise ConfigError(f"environment={env_option(cfg)} reward={cfg.reward.name}: {e}") from e
    inputs = Inputs(env, train, held, benchmarks, reward)
    if keep:
        _KEPT.clear()
        _KEPT[key] = inputs
    return inputs


def env_option(cfg: TrainConfig) -> str:
    """The `environment=` option a user types for this environment: a plug-in's class path
    (`mytask.tasks:CountA`) as the preset that names it (`count_a`); the name itself otherwise."""
    dirs = [CONF_DIR, *(Path(d) for d in cfg.config_path)]
    name = cfg.environment.name
    return option_naming("environment", name, dirs) or name


def check_verifier_kinds(cfg: TrainConfig, env: Environment) -> None:
    """Every verifier the reward uses must be of a kind the environment supports. The fix names
    the options a user types (`verifier_set=count_a`), never a plug-in's class path."""
    kinds = supported_kinds(env)
    for v in cfg.reward.verifiers:
        if not supports(env, v):
            option = env_option(cfg)
            shown = f"environment={env.name}" + (f" (preset environment={option})"
                                                 if option != env.name else "")
            if cfg.verifier_set.name == option:  # the set made for it is the one in use
                fix = (f"Make that set's verifiers (verifier_set/{option}.yaml) of those kinds, "
                       f"or declare {v.kind!r} in the environment's own_verifier_kinds")
            else:
                fix = (f"Use the set made for it (verifier_set={option}, the default when the "
                       f"file verifier_set/{option}.yaml exists in a config folder) or list "
                       f"verifiers of those kinds")
            raise ConfigError(
                f"verifier_set={cfg.verifier_set.name or '?'}: verifier {v.name!r} "
                f"(kind {v.kind}) cannot score {shown}, which supports the kinds "
                f"{sorted(kinds)}. {fix}")


def char_tokenizer_dir(model: ModelConfig) -> Path | None:
    """The folder of the CPU character tokenizer the policy will use, known before the model is
    built: the tiny model without `model.path` is written with the asset's copy
    (`rlexp.models.tiny.ensure_tiny_checkpoint`); a `model.path` folder holding one uses its own.
    None: a Hugging Face tokenizer (or a path that does not exist yet: `prepare` reports it)."""
    if model.flavor == "tiny" and not model.path:
        return ASSET.parent
    if model.path and (Path(model.path).expanduser() / CHAR_TOKENIZER_FILE).is_file():
        return Path(model.path).expanduser()
    return None


VOCAB_TRAIN_CHECKED = 2000  # training samples checked against the character vocabulary (seeded)


def check_vocabulary(cfg: TrainConfig, train: list[Any], held: list[Any], model_dir: str | Path,
                     warn: bool = True) -> dict[str, Any] | None:
    """Prompts and answers against the CPU character tokenizer, which encodes a character it lacks
    as "?": a prompt with `→` would train on "?" without a word. The held-out set and up to
    `VOCAB_TRAIN_CHECKED` training samples (seeded; millions of samples cost no more) are checked;
    a missing character is refused, naming a sample, the character and its code point, unless
    `model.unknown_chars=map` (then said once, when `warn`). A Hugging Face tokenizer is
    byte-level: nothing to check (None). Returns what was checked, for the manifest."""
    from rlexp.models.tokenizer import CharTokenizer

    if not (Path(model_dir) / CHAR_TOKENIZER_FILE).exists():
        return None
    tok = CharTokenizer(Path(model_dir) / CHAR_TOKENIZER_FILE)
    picked = train if len(train) <= VOCAB_TRAIN_CHECKED else \
        random.Random(0).sample(train, VOCAB_TRAIN_CHECKED)
    checked = [*held, *picked]
    found = []  # (sample, "prompt" | "answer", the first character missing), one per sample
    for s in checked:
        for what, text in (("prompt", s.problem.prompt), ("answer", s.answer)):
            if (c := tok.unknown(text)) is not None:
                found.append((s, what, c))
                break
    summary = {"checked": len(checked), "of": len(train) + len(held), "unknown": len(found),
               "mode": str(cfg.model.unknown_chars)}
    if not found:
        return summary
    s, what, c = found[0]
    where = (f"{len(found)} of the {len(checked)} samples checked ({len(held)} held-out, "
             f"{len(picked)} of {len(train)} training) hold characters the CPU character tokenizer "
             f"cannot encode (it has printable ASCII, tab and newline; "
             f"rlexp/assets/rlexp_char_tokenizer.json); the first: {c!r} (U+{ord(c):04X}) in the "
             f"{what} of problem {s.problem.id!r}: {s.problem.prompt[:80]!r}")
    env = f"environment={cfg.environment.name}"
    if cfg.model.unknown_chars == "map":
        if warn:
            print(f"[rlexp] warning: {env}: {where}; each is encoded as '?' "
                  f"(model.unknown_chars=map)",
                  file=sys.stderr, flush=True)
        return summary
    raise ConfigError(f"{env}: {where}. Write it in ASCII in the environment's prompts and answers "
                      f"(e.g. '->' for '\u2192'), use a model with its own tokenizer (model=...), "
                      f"or set model.unknown_chars=map to encode each as '?'")


def check_prompt_lengths(cfg: TrainConfig, env_name: str, splits: dict[str, list[Any]],
                         model_dir: str | Path) -> None:
    """Every prompt must leave the policy room for a token: a longer one is past the end of the
    model's RoPE table, which the trainer's forward meets only when that prompt is first drawn
    (GPQA's 1,669-token prompts against the tiny model's 1,024, minutes into a run). Only prompts
    whose UTF-8 length could reach the limit are tokenized (no tokenizer here makes more tokens
    than bytes, plus a few special ones)."""
    limit = int(cfg.model.arch.max_seq_len)
    tok = None
    over: dict[str, tuple[int, int, int]] = {}
    for split, samples in splits.items():
        lengths = []
        for s in samples:
            prompt = s.problem.prompt
            if len(prompt.encode()) + 16 < limit:
                continue
            if tok is None:
                from rlexp.models.tokenizer import load_tokenizer

                tok = load_tokenizer(model_dir)
            n = len(tok.encode(prompt))
            if n >= limit:
                lengths.append(n)
        if lengths:
            over[split] = (len(lengths), len(samples), max(lengths))
    if over:
        worst = max(n for _, _, n in over.values())
        what = "; ".join(f"{k} of {n} {split} prompts (longest {m} tokens)"
                         for split, (k, n, m) in over.items())
        raise ConfigError(f"environment={env_name}: {what} do not fit the policy's context, "
                          f"model.arch.max_seq_len={limit} tokens, with room for a response. "
                          f"Use a model with a longer context, or raise "
                          f"model.arch.max_seq_len to at least "
                          f"{worst + cfg.algorithm.max_tokens} (the tiny model builds its "
                          f"RoPE table from it), or point environment.dataset at shorter "
                          f"problems")


def check_inputs(cfg: TrainConfig) -> None:
    """`rlexp train`'s checks of the inputs before torch loads (see the module docstring): the
    inputs loaded and kept for `prepare`, then, for the character tokenizer, every prompt's length
    and the vocabulary (its `map` warning is `prepare`'s to print, once)."""
    inputs = load_inputs(cfg, keep=True)
    served_checkpoints(cfg, inputs.reward, stand_ins=False)
    check_model_checkpoint(cfg.model, cfg.algorithm.max_prompt_tokens, cfg.algorithm.max_tokens)
    if (tok_dir := char_tokenizer_dir(cfg.model)) is None:
        return
    splits = {"train": inputs.train, "eval": inputs.held}
    check_prompt_lengths(cfg, inputs.env.name, splits, tok_dir)
    check_vocabulary(cfg, inputs.train, inputs.held, tok_dir, warn=False)


def served_checkpoints(cfg: TrainConfig, reward: Reward, *, stand_ins: bool = True) -> list[Any]:
    """The verifiers `reward` serves with a model, each with `options.path` set to its checkpoint
    folder (`verifier_checkpoint`); every missing one at once in one `CheckpointError`, each with
    its download command. `stand_ins=False` (before torch loads) leaves out the tiny stand-ins,
    which are trained on first use."""
    served, missing = [], []
    try:
        for v in reward.verifiers:
            if not isinstance(v, ServedVerifier) or (not stand_ins and "tiny" in v.cfg.options):
                continue
            try:
                served.append(verifier_checkpoint(v.cfg))
            except CheckpointError as e:
                missing.append(str(e))
    except (ValueError, FileNotFoundError) as e:  # a verifier's checkpoint options: one clear line
        raise ConfigError(f"environment={env_option(cfg)} reward={cfg.reward.name}: {e}") from e
    if missing:
        raise CheckpointError("\n  - ".join(["missing verifier checkpoints:", *missing]))
    return served


def check_model_checkpoint(model: ModelConfig, max_prompt_tokens: int, max_tokens: int) -> None:
    """A model with files of its own (`model.path`, `model.hf_repo`) found and its safetensors
    headers and config.json checked against `model.arch` and the run's lengths, without torch; the
    tiny model's checkpoint is written from `model.arch`, so there is nothing to check."""
    folder = find_checkpoint(model)
    if folder is None:
        return
    validate_checkpoint(folder, model)
    # on a copy: `prepare` applies them, and says what it lowered
    apply_checkpoint_limits(replace(model, arch=replace(model.arch)), folder, max_prompt_tokens,
                            max_tokens)


def apply_checkpoint_limits(model: ModelConfig, folder: str | Path, max_prompt_tokens: int,
                            max_tokens: int) -> list[str]:
    """The checkpoint's own config.json limits (`rlexp.models.limits`) applied to `model`: what was
    changed, one line each; `ConfigError` for what cannot be adjusted."""
    if (limits := read_limits(folder)) is None:
        return []
    try:
        return apply_limits(model, limits, max_prompt_tokens, max_tokens)
    except LimitError as e:
        raise ConfigError(str(e)) from None
