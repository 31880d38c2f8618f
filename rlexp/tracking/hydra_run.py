"""What Hydra knows about a run, and the names rlexp gives it: overrides, group choices, the sweep a job belongs
to, the run's name (by what it changes, sweep keys first), the shell command that runs it again; and Hydra's
own copies in the run folder (`.hydra/*.yaml`, the sweep's `multirun.yaml`), which hold raw values until they
are rewritten redacted here."""
from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from .files import atomic_write_text
from .redact import redact, redact_override, redact_text
from .runconfig import RUN_LOCAL_ANY_KEYS


def hydra_info(run_dir: Path) -> dict[str, Any]:
    """Overrides, group choices and multirun identity: from the live HydraConfig when inside a Hydra app,
    else from `run_dir/.hydra/` (so a manifest can be rebuilt from a finished run folder)."""
    info: dict[str, Any] = {
        "mode": None, "overrides": [], "choices": {}, "job_name": None, "job_num": None,
        "sweep_dir": None, "run_dir": str(run_dir), "config_name": None, "config_dir": None, "runtime_cwd": None,
    }
    hc: Any = None
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            hc = HydraConfig.get()
    except Exception:
        hc = None
    if hc is None:
        hydra_yaml = run_dir / ".hydra" / "hydra.yaml"
        if hydra_yaml.exists():
            hc = OmegaConf.load(hydra_yaml).hydra
    if hc is not None:
        mode = OmegaConf.select(hc, "mode")
        info["mode"] = str(getattr(mode, "name", mode)) if mode is not None else None
        info["overrides"] = list(OmegaConf.select(hc, "overrides.task") or [])
        info["choices"] = {str(k): (None if v is None else str(v))
                           for k, v in (OmegaConf.to_container(hc.runtime.choices) or {}).items()}
        info["job_name"] = OmegaConf.select(hc, "job.name")
        info["config_name"] = OmegaConf.select(hc, "job.config_name")
        info["runtime_cwd"] = OmegaConf.select(hc, "runtime.cwd")
        for src in OmegaConf.select(hc, "runtime.config_sources") or []:
            if src.get("provider") == "command-line" and src.get("schema") == "file":
                info["config_dir"] = src.get("path")
        if info["mode"] == "MULTIRUN":
            sweep = Path(str(OmegaConf.select(hc, "sweep.dir")))
            if not sweep.is_absolute():  # relative to the launch dir, not to a job dir (hydra.job.chdir)
                sweep = Path(info["runtime_cwd"] or os.getcwd()) / sweep
            info["sweep_dir"] = str(sweep.resolve())
            num = OmegaConf.select(hc, "job.num")
            info["job_num"] = int(num) if num is not None else None
    ov = run_dir / ".hydra" / "overrides.yaml"
    if ov.exists():  # the file is the ground truth Hydra itself wrote for this job
        info["overrides"] = [str(x) for x in (OmegaConf.load(ov) or [])]
    info["swept"] = sweep_params(Path(info["sweep_dir"])) if info["sweep_dir"] else {}
    # Overrides are redacted by name and value here; the rest (paths, choices) by value in write_start_manifest,
    # after the raw paths have been used to find the files to redact and to name the run.
    info["overrides"] = [redact_override(o) for o in info["overrides"]]
    return info


def override_key(override: str) -> str:
    return str(override).split("=", 1)[0].lstrip("~+")


def sweep_params(sweep_dir: Path) -> dict[str, str]:
    """The keys a sweep varies and their values as given (`{"reward": "rule,annotated", "seed": "0,1"}`): sweep
    overrides of the command line and the sweeper's `params` (the grid and Optuna presets), read from the
    `multirun.yaml` Hydra writes before the first job starts."""
    path = Path(sweep_dir) / "multirun.yaml"
    if not path.is_file():
        return {}
    try:
        hc = OmegaConf.load(path).hydra
        task = [str(o) for o in (OmegaConf.select(hc, "overrides.task") or [])]
        node = OmegaConf.select(hc, "sweeper.params")
        params = OmegaConf.to_container(node) if node is not None else {}
    except Exception:  # an unreadable file names nothing, rather than failing the run
        return {}
    out = {str(k): str(v) for k, v in params.items() if v is not None}
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parsed = OverridesParser.create().parse_overrides(task)
        for o, raw in zip(parsed, task):  # the command line wins over the preset's params, as in Hydra
            key = o.key_or_group.lstrip("~+")
            if o.is_sweep_override():
                out[key] = raw.split("=", 1)[1]
            else:
                out.pop(key, None)
    except Exception:  # not parseable here: a value with an unescaped comma is a sweep
        for raw in task:
            if "=" in raw and re.search(r"(?<!\\),", raw.split("=", 1)[1]):
                out[override_key(raw)] = raw.split("=", 1)[1]
            else:
                out.pop(override_key(raw), None)
    return {k: v for k, v in out.items() if not k.startswith("hydra.")}


def sweep_size(sweep_dir: Path) -> int | None:
    """How many jobs the sweep launches, from its `multirun.yaml`: the grid's product for Hydra's basic sweeper
    (`seed=0,1 lr=range(1,4)`: 6), `n_trials` for a sweeper that has one (Optuna); None when it cannot be told
    (another sweeper, an unreadable file). What lets a job know it is the sweep's last one."""
    path = Path(sweep_dir) / "multirun.yaml"
    try:
        sweeper = OmegaConf.load(path).hydra.sweeper
    except Exception:
        return None
    if OmegaConf.select(sweeper, "n_trials") is not None:
        return int(OmegaConf.select(sweeper, "n_trials"))
    if "BasicSweeper" not in str(OmegaConf.select(sweeper, "_target_") or ""):
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    size = 1
    try:
        for o in OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in sweep_params(sweep_dir).items()]):
            if o.is_sweep_override():
                size *= len(list(o.sweep_string_iterator()))
    except Exception:  # a value Hydra's grammar does not read here: the size is unknown, not guessed
        return None
    return size


# Overrides that say where or how a run is recorded, not what it computes: left out of run names.
_NAME_SKIP_PREFIXES = ("hydra.", "logger", "sweeps", "resume", "force_resume")


def name_from_overrides(overrides: Sequence[str], swept: Iterable[str] = ()) -> str | None:
    """`reward=rule,seed=0,steps=30`: a run named by what it changes, like Hydra's `override_dirname`, with the
    sweep's varying keys first so a truncated name in a tracker's table still tells the jobs apart."""
    swept = set(swept)
    kept = [o for o in overrides if "=" in o and not override_key(o).startswith(_NAME_SKIP_PREFIXES)
            and not any(p in RUN_LOCAL_ANY_KEYS for p in override_key(o).split("."))]
    kept.sort(key=lambda o: (override_key(o) not in swept, o))  # Hydra sorts override_dirname as strings
    return ",".join(kept) or None


def shell_command(argv: Sequence[str], hyd: Mapping[str, Any]) -> str:
    """The command that runs this run again, pastable into a shell: `rlexp train` (the program name the CLI
    sets is two words) plus this run's own overrides; a multirun job gets its own overrides, not the sweep's."""
    from rlexp.config.suggest import user_args

    prog = str(argv[0]) if argv else "rlexp train"
    head = prog.split() if re.fullmatch(r"rlexp \w+", prog) else [prog]
    args = [str(a) for a in argv[1:]]
    if hyd.get("mode") == "MULTIRUN":
        keep = [a for a in args if a.startswith("-") or "=" not in a]  # --config-dir DIR and friends
        args = [a for a in keep if a != "-m" and a != "--multirun"] + [str(o) for o in hyd.get("overrides") or []]
    return shlex.join([*head, *user_args(args)])  # `hydra.searchpath` is rlexp's own, derived from config_path


def run_identity(hyd: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """Names used by remote trackers and `rlexp compare`: a run is named by its overrides (sweep keys first),
    else by its folder. Multirun jobs share `group` (the sweep id); a single run is its own group. Keeping
    this in the manifest lets every tracker agree on it."""
    ident = _folder_identity(hyd, run_dir)
    swept = dict(hyd.get("swept") or {})
    ident["folder_name"] = ident["run_name"]
    ident["run_name"] = name_from_overrides(hyd.get("overrides") or [], swept) or ident["run_name"]
    ident["swept"] = swept
    return ident


def _folder_identity(hyd: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    job = hyd.get("job_name") or "run"
    if hyd.get("sweep_dir"):
        sweep = Path(hyd["sweep_dir"])
        sweep_id = f"{sweep.parent.name}_{sweep.name}" if sweep.parent.name else sweep.name
        sweep_id = f"{sweep_id}-{hashlib.sha1(str(sweep).encode()).hexdigest()[:6]}"
        # The job's folder inside the sweep (normally its job number) is unique even when a second
        # process adds jobs to the same sweep dir, where Hydra would restart numbering at 0.
        try:
            sub = run_dir.resolve().relative_to(sweep.resolve()).as_posix()
        except ValueError:
            sub = run_dir.name
        name = f"{job}-{sweep_id}-{sub.replace('/', '_')}"
        num = hyd.get("job_num")
        return {"run_name": name, "group": sweep_id, "sweep_id": sweep_id, "sweep_dir": str(sweep), "job_num": num}
    name = f"{job}-{run_dir.parent.name}_{run_dir.name}" if run_dir.parent.name else f"{job}-{run_dir.name}"
    return {"run_name": name, "group": name, "sweep_id": None, "sweep_dir": None, "job_num": None}


def group_tags(choices: Mapping[str, Any]) -> list[str]:
    """`model=tiny`, `reward=weaver`... (Hydra's own groups such as hydra/launcher are left out)."""
    return [f"{k}={v}" for k, v in sorted(choices.items()) if not str(k).startswith("hydra") and v is not None]



# --------------------------------------------------------------------------------------------- Hydra's copies
def redact_yaml_file(path: Path) -> bool:
    """Rewrite a YAML file (a Hydra `.hydra/*.yaml` copy, `multirun.yaml`) redacted, atomically; untouched when
    there is nothing to redact. Interpolations are kept unresolved. Returns True when the file was rewritten."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return False
    try:
        loaded = OmegaConf.create(text)  # OmegaConf's YAML loader: the types Hydra wrote (1e-5 is a float)
        data = OmegaConf.to_container(loaded, resolve=False, throw_on_missing=False)
        clean = redact(data, keep_interpolations=True)
        if clean == data:
            return False
        new = OmegaConf.to_yaml(OmegaConf.create(clean))
    except Exception:  # not YAML OmegaConf can read: still strip token shapes line by line
        new = redact_text(text)
        if new == text:
            return False
    atomic_write_text(path, new)
    return True


def redact_hydra_files(run_dir: Path, sweep_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Redact the copies Hydra wrote with raw values: `run_dir/.hydra/*.yaml` and the sweep's `multirun.yaml`."""
    run_dir = Path(run_dir)
    files = sorted((run_dir / ".hydra").glob("*.yaml")) if (run_dir / ".hydra").is_dir() else []
    if sweep_dir is not None and (Path(sweep_dir) / "multirun.yaml").is_file():
        files.append(Path(sweep_dir) / "multirun.yaml")
    return [str(p) for p in files if redact_yaml_file(p)]

