"""`rlexp train`'s checks before Hydra writes anything and before torch loads: a mistake costs a second and
leaves no run folder behind.

`split_argv` puts Hydra's flags before the overrides (so `--cfg job` works in any position), `check_overrides`
judges each override as typed (a key of the schema, a group option that exists, with the close matches), and
`check_composed` composes the config with Hydra's compose API, as `@hydra.main` is about to, and runs the
checks that need no torch: YAML keys of the user's presets, the sweep's parameters, class paths (found on disk,
not imported), `rlexp.config.validate.validate`, the environment's options, this machine's sizes
and GPUs (`check_gpus`: `nvidia-smi`, not torch), and the inputs
(`rlexp.run.inputs.check_inputs`: the data, the benchmarks, the reward, the vocabulary).
`rlexp.train.train` runs them on each sweep job's own values (`check_job`); `rlexp.run.prepare`
runs them again after torch loads (for callers other than the CLI).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlexp.config.overrides import _SPECIAL_KEY, check_composed_keys, config_groups, refusals
from rlexp.config.paths import CONF_DIR
from rlexp.config.suggest import (
    INTERNAL_KEYS,
    class_path_error,
    is_class_path,
    schema_keys,
    unknown_key,
    unknown_option,
    unknown_options_key,
    user_args,
)
from rlexp.config.trust import Trust
from rlexp.config.validate import ConfigError

if TYPE_CHECKING:
    from omegaconf import DictConfig

# Hydra's flags that take a value (`--cfg job`); `--info` takes one only from its choices.
WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
              "-cd", "--experimental-rerun"}
INFO = {"--info", "-i"}
INFO_CHOICES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
# With these Hydra prints something and runs nothing: only the overrides are checked.
SHOW_ONLY = {"--help", "-h", "--hydra-help", "--version", "--shell-completion", "-sc", "--cfg", "-c", "--info",
             "-i", "--experimental-rerun", "--config-path", "-cp", "--config-name", "-cn"}


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags with their values, the overrides), each in the order typed."""
    flags: list[str] = []
    overrides: list[str] = []
    it = iter(range(len(argv)))
    for i in it:
        a = argv[i]
        if not a.startswith("-"):
            overrides.append(a)
            continue
        flags.append(a)
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if nxt is not None and "=" not in a and (a in WITH_VALUE or (a in INFO and nxt in INFO_CHOICES)):
            flags.append(nxt)
            next(it, None)
    return flags, overrides


def flag_value(flags: Sequence[str], *names: str) -> str | None:
    for i, f in enumerate(flags):
        name, eq, value = f.partition("=")
        if name in names:
            return value if eq else (flags[i + 1] if i + 1 < len(flags) else None)
    return None


def conf_dirs(flags: Sequence[str], overrides: Sequence[str]) -> list[Path]:
    """rlexp's configs, a `--config-dir`, and the folders of `config_path=[...]` (as `with_config_path` wrote)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    dirs = [CONF_DIR]
    if (d := flag_value(flags, "--config-dir", "-cd")) is not None:
        dirs.append(Path(d).expanduser().resolve())
    for a in overrides:
        if a.split("=", 1)[0] == "config_path":
            value = OverridesParser.create().parse_override(a).value()
            dirs += [Path(str(v)) for v in (value if isinstance(value, list) else [value])]
    return dirs


def _values(o: Any) -> list[str]:
    """A group override's option names: one, or each of a sweep's choices."""
    if o.is_sweep_override():
        with contextlib.suppress(Exception):  # an interval or a tagged sweep names no options
            return [str(v) for v in o.sweep_string_iterator()]
        return []
    value = o.value()
    return [str(value)] if value is not None else []


def check_overrides(overrides: Sequence[str], dirs: Sequence[Path]) -> None:
    """Each override the user typed: a key of the schema or a group option that exists, else a `ConfigError`
    with the close matches (Hydra's own advice, `+key=...`, would add a key the run then refuses)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    groups = config_groups(dirs)
    for raw in user_args(overrides):
        try:
            o = parser.parse_override(raw)
        except Exception:  # Hydra's grammar error says where the override is malformed: left to it
            continue
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")) or key in INTERNAL_KEYS:
            continue
        if key in groups or "/" in key:
            if o.is_delete():
                continue
            for value in _values(o):
                if (why := unknown_option(key, value, dirs)) is not None:
                    raise ConfigError(why)
            continue
        if special := [p for p in key.split(".") if _SPECIAL_KEY.match(p)]:
            raise ConfigError(f"{key}: {special[0]!r} would make Hydra instantiate an object; rlexp's config holds "
                              f"data only, remove the override")
        if (why := unknown_key(key, extra=groups)) is not None:
            raise ConfigError(why)


def _hydra_source(e: BaseException, dirs: Sequence[Path]) -> str:
    """'<file>: ' for a composition error that names the config it merged (`In 'experiment/bad': ...`)."""
    import re

    m = re.match(r"In '([^']+)'", str(e))
    if not m:
        return ""
    files = [d / f"{m.group(1)}.yaml" for d in dirs if (d / f"{m.group(1)}.yaml").is_file()]
    return f"{files[-1] if files else m.group(1)}: "


def _translate(e: BaseException, dirs: Sequence[Path]) -> ConfigError:
    """Hydra's composition error as rlexp's: the file, the key and its close matches, no `+key` advice."""
    import re

    added = re.search(r"Could not override '([^']+)'\. No match in the defaults list\..*?(\+\S+=\S+)", str(e), re.S)
    if added and added.group(1) == "benchmark":  # rlexp eval's group; a run names extra benchmarks in a list
        value = added.group(2).split("=", 1)[1]
        return ConfigError(f"benchmark={value}: benchmark is rlexp eval's group (rlexp eval benchmark={value}); a "
                           f"training run evaluates extra benchmarks with eval.benchmarks=[{value}]")
    if added:  # a group train.yaml does not select: Hydra's advice is right for groups, in rlexp's words
        return ConfigError(f"{added.group(1)} is a group that rlexp train does not select by default, so an "
                           f"option of it is added, not replaced: write {added.group(2)}")
    cause: BaseException | None = e
    while cause is not None and getattr(cause, "full_key", None) is None:
        cause = cause.__cause__ or cause.__context__
    source = _hydra_source(e, dirs)
    full_key = getattr(cause, "full_key", None)
    if full_key and type(cause).__name__ in ("ConfigKeyError", "ConfigAttributeError"):
        why = unknown_key(str(full_key))
        if why is not None:
            return ConfigError(source + why)
    lines: list[str] = []
    x: BaseException | None = e
    while x is not None and len(lines) < 6:  # Hydra's message, then its cause's ("Invalid value ...")
        lines += [ln.strip() for ln in str(x).splitlines() if ln.strip() and "To append" not in ln
                  and "HYDRA_FULL_ERROR" not in ln and ln.strip() not in lines
                  and not ln.lstrip().startswith(("full_key:", "reference_type=", "object_type="))]
        x = x.__cause__
    return ConfigError(source + ": ".join(lines))


def _first_values(overrides: Sequence[str]) -> list[str]:
    """The overrides with each sweep narrowed to its first value (what a single composition can check)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    out = []
    for raw in overrides:
        try:
            o = parser.parse_override(raw)
        except Exception:
            out.append(raw)  # Hydra's own message names it
            continue
        if not o.is_sweep_override():
            out.append(raw)
            continue
        with contextlib.suppress(Exception):
            first = next(iter(o.sweep_string_iterator()))
            out.append(f"{raw.split('=', 1)[0]}={first}")
    return out


def _into_options(overrides: Sequence[str]) -> list[str]:
    """Plain overrides of a key inside a free-form options mapping
    (`cluster.job_options.partiton=gpu`) as `++key=...`: composed, the key is there for
    `check_job_options` (and `check_env_options`) to judge against its owner's declared fields
    with the close matches, where Hydra's own refusal ("Key 'partiton' is not in struct") names
    no fix. Only this composition is changed, not the command Hydra runs."""
    out = []
    for raw in overrides:
        key = raw.split("=", 1)[0]
        if ("=" in raw and key[:1] not in "+~" and "." in key and "/" not in key
                and not key.startswith("hydra") and key not in schema_keys()
                and unknown_key(key) is None):
            raw = f"++{raw}"
        out.append(raw)
    return out


def check_job_options(t: Any) -> None:
    """`cluster.job_options` against the chosen backend's `Settings` fields
    (`rlexp.cluster.registry`), then their types and values (`JobBackend.settings`, `.check`:
    `port=80` is refused), before torch loads."""
    import dataclasses

    from rlexp.cluster.registry import job_backend

    try:
        backend = job_backend(t.cluster.job)
    except ValueError:  # an unknown backend: `validate` names it
        return
    known = [f.name for f in dataclasses.fields(backend.Settings)] if backend.Settings else []
    why = unknown_options_key("cluster.job_options", t.cluster.job_options or {}, known,
                              f"cluster.job={t.cluster.job}")
    if why is not None:
        raise ConfigError(why)
    try:
        backend.settings(t.cluster)
        backend.check(t.cluster)
    except ValueError as e:
        raise ConfigError(str(e)) from None


@contextlib.contextmanager
def _composer(dirs: Sequence[Path], config_name: str, with_hydra: bool) -> Iterator[Any]:
    from hydra import compose, initialize_config_dir

    from rlexp.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(Path(dirs[0]).resolve()), version_base="1.3"):
        yield lambda overrides: compose(config_name=config_name, overrides=list(overrides),
                                           return_hydra_config=with_hydra)


def compose(flags: Sequence[str], overrides: Sequence[str], dirs: Sequence[Path], with_hydra: bool) -> Any | None:
    """The config `@hydra.main` will compose (sweeps at their first value; `with_hydra`: its `hydra` node too), or
    None when Hydra is in use already (a caller inside a Hydra app): then Hydra's own composition reports."""
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return None
    search = ",".join(f"'file://{d}'" for d in dirs[1:])
    given = [a for a in overrides if a.split("=", 1)[0].lstrip("+") not in INTERNAL_KEYS]
    try:
        with _composer(dirs, flag_value(flags, "--config-name", "-cn") or "train", with_hydra) as run:
            internal = [f"hydra.searchpath=[{search}]"] if search else []
            return run([*_into_options(_first_values(given)), *internal])
    except ConfigError:
        raise
    except Exception as e:  # Hydra's composition errors: the file and the key, in rlexp's words
        raise _translate(e, dirs) from None


def check_composed(cfg: DictConfig, dirs: Sequence[Path], argv: Sequence[str] = ()) -> None:
    """The checks of `rlexp.run.prepare.prepare` that need neither torch nor a process, on the
    config Hydra is about to run; `ConfigError` names the key, the file and the close matches. `argv`: the
    overrides, for the nearest command a GPU refusal suggests."""
    from omegaconf import OmegaConf

    from rlexp.cluster.host_plan import check_sizes
    from rlexp.config.typed import typed_config
    from rlexp.config.validate import too_big_for_cpu, validate
    from rlexp.core.plugins import activate, search_paths
    from rlexp.envs.registry import build_env, check_env_options
    from rlexp.run.inputs import check_inputs

    here = True  # the run runs on this machine (a sweep's jobs may not: `runs_here`)
    if "hydra" in cfg:
        check_sweep_params(cfg, dirs)
        here = runs_here(cfg)
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
    check_composed_keys(cfg)
    t = typed_config(cfg)  # the one conversion `prepare` runs too, with its error naming the key
    check_job_options(t)
    paths = search_paths(t.config_path)
    check_class_paths(OmegaConf.to_container(cfg, resolve=True), paths)
    if t.trainer.micro_batch_size == 0:  # derived later from the memory plan (`check_config`)
        t.trainer.micro_batch_size = 1
    if not too_big_for_cpu(t):  # that refusal lists the missing weights too, which needs torch: left to prepare
        validate(t)
    check_loss_name(str(t.algorithm.loss), bool(t.plugins))
    activate(list(t.plugins), paths)  # the user's own modules (their command line names them)
    check_env_options(t.environment)
    check_multi_turn(t, build_env(t.environment))  # building reads no data: only the options and the class
    for name in t.eval.benchmarks:  # names of files in benchmark/ (rlexp.evals.benchmarks reads them later)
        if (why := unknown_option("benchmark", str(name), dirs)) is not None:
            raise ConfigError(f"eval.benchmarks: {why}")
    check_sizes(cfg)
    check_gpus(cfg, argv, here)
    if here:  # else each job checks its own, where it runs (`check_job`)
        check_inputs(t)  # the data, the benchmarks, the reward, the vocabulary (`rlexp.run.inputs`)


def runs_here(cfg: DictConfig) -> bool:
    """Whether a sweep's jobs run on this machine: Hydra's basic launcher (in this process) or
    submitit's local one; a Slurm launcher's jobs run on other machines, whose GPUs and files
    these checks cannot see from here (`rlexp.train.train` runs them in each job)."""
    from omegaconf import OmegaConf

    target = str(OmegaConf.select(cfg, "hydra.launcher._target_") or "")
    return not target or target.endswith((".BasicLauncher", ".LocalLauncher"))


def check_gpus(cfg: DictConfig, argv: Sequence[str], here: bool = True) -> None:
    """On CUDA, this machine's GPUs against the memory plan (`rlexp.cluster.planner.check_devices`)
    and its driver against torch's build (`rlexp.cluster.cuda_env.driver_problem`), decided from the
    config, `nvidia-smi` and `CUDA_VISIBLE_DEVICES` without importing torch; then a real model's
    layout against the plan (the same refusal as `rlexp.run.prepare.check_config`'s). Where only
    torch can tell (`rlexp.cluster.cuda_env.host_cuda` says None: ROCm, MIG, a mask of UUIDs), or
    the job kind is not known yet, `rlexp.run.prepare.check_config` checks after torch loads."""
    from rlexp.cluster.cuda_env import driver_problem, query_host_cuda
    from rlexp.cluster.layout import controller_gpus
    from rlexp.cluster.planner import PlanError, check_devices, plan_memory
    from rlexp.cluster.registry import job_backend
    from rlexp.config.typed import typed_config

    t = typed_config(cfg)  # a copy of its own: the plan derives a micro-batch size of 0
    if t.cluster.device != "cuda":
        return
    try:
        job_backend(t.cluster.job)
    except ValueError:  # prepare names it
        return
    report = plan_memory(t)
    # `here`: the run is on this machine (not a sweep's job that a Slurm launcher sends elsewhere)
    if here and (needed := controller_gpus(t)) and (host := query_host_cuda()) is not None:
        facts, gpus, gib = host
        check_devices(report, t.cluster, have=(gpus, gib), argv=list(argv), needed=needed)
        if problem := driver_problem(facts):
            raise ConfigError(problem)
    if t.model.flavor != "tiny" and not report.ok:  # whatever the machine: the layout itself
        raise PlanError("the configured layout does not fit:\n" + report.table(), report)


def check_multi_turn(t: Any, env: Any) -> None:
    """Multi-turn limits that cannot work, refused before anything spawns (and, from `rlexp train`, before torch
    loads: it needs the environment's class and options only)."""
    from rlexp.envs.base import Environment

    e, name = t.environment, t.environment.name
    if e.max_turns < 1:
        raise ConfigError(f"environment.max_turns={e.max_turns}: need at least 1 (one policy response)")
    if e.max_turns > 1 and type(env).step is Environment.step:
        raise ConfigError(f"environment={name} is single-turn (it has no `step` to reply with), so "
                          f"environment.max_turns={e.max_turns} cannot apply; leave it at 1")
    if env.max_response_tokens and t.algorithm.max_tokens > env.max_response_tokens:
        raise ConfigError(f"environment={name} judges responses of at most {env.max_response_tokens} token(s); "
                          f"algorithm.max_tokens={t.algorithm.max_tokens} is larger. Set algorithm.max_tokens="
                          f"{env.max_response_tokens}")
    if t.algorithm.max_tokens < env.min_response_tokens:
        raise ConfigError(f"environment={name}: a right answer is {env.min_response_tokens} tokens long, but "
                          f"algorithm.max_tokens={t.algorithm.max_tokens} cuts every response shorter. Set "
                          f"algorithm.max_tokens={env.min_response_tokens}")
    if env.multi_turn:
        room = e.max_episode_tokens or (t.model.arch.max_seq_len - t.algorithm.max_prompt_tokens)
        if e.max_episode_tokens < 0 or room < t.algorithm.max_tokens:
            raise ConfigError(f"environment.max_episode_tokens={e.max_episode_tokens} leaves {room} tokens per "
                              f"episode, less than one turn (algorithm.max_tokens={t.algorithm.max_tokens}); raise "
                              f"it (0: the model's context, model.arch.max_seq_len={t.model.arch.max_seq_len})")
        if e.max_reply_tokens < 1 or e.step_timeout_s < 0:
            raise ConfigError(f"environment.max_reply_tokens={e.max_reply_tokens} must be >= 1 and "
                              f"environment.step_timeout_s={e.step_timeout_s} >= 0 (0: no time limit)")


def check_loss_name(name: str, plugins: bool) -> None:
    """`algorithm.loss` by a plain name is one `rlexp.algorithm.grpo` registers: the names are read
    from its `@LOSSES.register("...")` lines with `ast` (that module imports torch). A class path is
    judged by `check_class_paths`; with `plugins` listed a user's module may register more names,
    which only its import can tell (`rlexp.run.prepare.check_config`, after torch loads)."""
    import ast

    from rlexp.config.suggest import did_you_mean, is_class_path

    if is_class_path(name) or plugins:
        return
    source = Path(__file__).resolve().parents[1] / "algorithm" / "grpo.py"
    names = sorted(
        arg.value
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.ClassDef)
        for deco in node.decorator_list
        if isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
        and deco.func.attr == "register" and isinstance(deco.func.value, ast.Name)
        and deco.func.value.id == "LOSSES"
        for arg in deco.args[:1]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str))
    if name not in names:
        import difflib

        close = difflib.get_close_matches(name, names, n=3, cutoff=0.7)
        raise ConfigError(
            f"algorithm.loss={name}: unknown loss {name!r}{did_you_mean(close)} Choose one of "
            f"{names}, or name your own class as package.module:Class (a subclass of "
            "rlexp.algorithm.grpo.PolicyLoss) or register it by name in a module listed in "
            "`plugins`")


def check_class_paths(node: dict[str, Any], paths: Sequence[str]) -> None:
    """Every `module:Class` the config names as code, found on disk without importing it (`class_path_error`)."""
    for key, kind, value in refusals([], node):
        if kind == Trust.CODE and is_class_path(value):
            why = class_path_error(key.lstrip("."), str(value), paths)
            if why is not None:
                raise ConfigError(why)


def check_sweep_params(cfg: DictConfig, dirs: Sequence[Path]) -> None:
    """The keys a sweep preset varies (`hydra.sweeper.params`, Optuna's included) are keys of the config."""
    params = cfg.get("hydra", {}).get("sweeper", {}).get("params") or {}
    groups = config_groups(dirs)
    for key in params:
        key = str(key)
        if key in groups or "/" in key or key.startswith("hydra"):
            continue
        if (why := unknown_key(key, extra=groups)) is not None:
            raise ConfigError(f"hydra.sweeper.params: {why}")


def check_job(cfg: DictConfig) -> None:
    """A sweep's job, before torch loads (`rlexp.train.train`): `check_composed` on the job's own
    values, since `preflight` composed each swept key's first value only and a sweeper's parameters
    not at all. Its inputs are kept for its `prepare` (`rlexp.run.inputs.load_inputs`)."""
    import copy

    from hydra.core.hydra_config import HydraConfig

    dirs = [CONF_DIR, *(Path(str(d)) for d in (cfg.get("config_path") or []))]
    check_composed(copy.deepcopy(cfg), dirs, [str(o) for o in HydraConfig.get().overrides.task])


def preflight(argv: Sequence[str]) -> list[str]:
    """`argv` (`rlexp train`'s, `config_path` already expanded) with Hydra's flags first; `ConfigError` for a
    mistake found before anything is written (see the module docstring)."""
    flags, overrides = split_argv(argv)
    dirs = conf_dirs(flags, overrides)
    check_overrides(overrides, dirs)
    show_only = any(f.split("=", 1)[0] in SHOW_ONLY for f in flags)
    multirun = any(f in ("-m", "--multirun") for f in flags)
    if show_only:
        # `--cfg job` prints what Hydra composes; a typo inside an options mapping (free-form to
        # Hydra) would be refused in Hydra's words ("not in struct", `+key` advice): named here
        if any(".options." in o or "job_options." in o for o in overrides):
            from rlexp.config.typed import typed_config
            from rlexp.envs.registry import check_env_options

            if (cfg := compose(flags, overrides, dirs, with_hydra=False)) is not None:
                typed = typed_config(cfg)
                check_job_options(typed)
                check_env_options(typed.environment)
    elif (cfg := compose(flags, overrides, dirs, with_hydra=multirun)) is not None:
        check_composed(cfg, dirs, overrides)
    return [*flags, *overrides]


def user_options_help(argv: Sequence[str]) -> str | None:
    """For `rlexp train --help config_path=DIR`: the options of the user's own config folders (Hydra's help lists
    the groups of its primary search path only). None without such folders or without a help flag."""
    flags, overrides = split_argv(argv)
    if not any(f in ("--help", "-h") for f in flags):
        return None
    dirs = conf_dirs(flags, overrides)[1:]
    if not dirs:
        return None
    from rlexp.config.suggest import group_options

    lines = ["== Your config folders (config_path, --config-dir) =="]
    for d in dirs:
        lines.append(f"{d}:")
        for group in sorted(p.name for p in Path(d).iterdir() if p.is_dir()):
            options = group_options(group, [d])
            if options:
                lines.append(f"  {group}: {', '.join(options)}")
    return "\n".join(lines)
