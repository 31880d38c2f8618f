"""`rlexp eval`: score a model (or a finished run's final checkpoint) on benchmarks.

    rlexp eval model=qwen3_8b benchmark=all [n=4 temperature=0.6] [--out results/my-eval]
    rlexp eval run_dir=runs/2026-11-29/12-00-00 benchmark=gsm8k

Arguments are Hydra overrides of conf/eval.yaml (groups `model` and `benchmark`); `--out PATH` is a shortcut
for `out=PATH`, `--config-dir DIR` composes from another conf folder. The config is composed with Hydra's
compose API rather than `@hydra.main` so this entry point can be called as a function (`main(argv)`)
from rlexp's dispatcher and from tests without Hydra taking over the working directory or logging.

Writes to the output folder: `samples_<benchmark>.jsonl` (one line per response), `results.md` and
`results.csv` (one row per benchmark) and `manifest.json` (config, versions, dataset fingerprints, model hash).
"""
from __future__ import annotations

import datetime as _dt
import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlexp.envs.base import Environment, build_env
from rlexp.envs.config import EnvConfig
from rlexp.envs.data import DatasetMissing
from rlexp.evals.runner import BenchmarkResult, run_benchmark

log = logging.getLogger("rlexp.eval")
DEFAULT_CONF = Path(__file__).resolve().parents[2] / "conf"


def _split_flags(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    overrides, flags, i = [], {}, 0
    while i < len(argv):
        a = argv[i]
        if a in ("--out", "--config-dir"):
            if i + 1 >= len(argv):
                raise SystemExit(f"{a} needs a value")
            flags[a[2:]] = argv[i + 1]
            i += 2
            continue
        if a.startswith(("--out=", "--config-dir=")):
            k, v = a[2:].split("=", 1)
            flags[k] = v
        else:
            overrides.append(a)
        i += 1
    return overrides, flags


def compose(overrides: list[str], config_dir: str | Path = DEFAULT_CONF) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base="1.3"):
        return hydra_compose("eval", overrides=overrides)


def env_config(d: Any) -> EnvConfig:
    """An EnvConfig from a YAML mapping (typed: unknown keys fail here, not deep in a loader)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(EnvConfig), d))  # type: ignore[return-value]


def benchmark_envs(cfg: DictConfig) -> dict[str, tuple[Environment, int]]:
    """name -> (environment, max_tokens) for every benchmark selected in the `benchmark` group."""
    out = {}
    for name, spec in cfg.benchmark.items():
        env = build_env(env_config(spec.environment))
        out[str(name)] = (env, int(cfg.max_tokens or spec.get("max_tokens", 1024)))
    return out


def model_dir_of(cfg: DictConfig) -> tuple[Path, str]:
    """The HF-format folder to evaluate and a short label for it."""
    if cfg.run_dir:
        final = Path(cfg.run_dir).expanduser() / "checkpoints" / "final"
        if not (final / "config.json").exists():
            raise FileNotFoundError(f"run_dir={cfg.run_dir}: no final checkpoint at {final} (is the run finished? "
                                    f"a training run writes checkpoints/final/ when it completes)")
        return final, f"run-{Path(cfg.run_dir).name}"
    if cfg.get("model") is None:
        raise FileNotFoundError("no model selected: pass model=NAME (a file conf/model/NAME.yaml) or run_dir=PATH")
    from rlexp.models.config import ModelConfig
    from rlexp.models.hf import resolve_checkpoint

    mcfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg.model))
    return resolve_checkpoint(mcfg), str(cfg.model.name)  # type: ignore[arg-type]


def make_generate_fn(backend: Any, stop: tuple[str, ...]):
    def generate_fn(prompt_ids, n, max_tokens, temperature, seed):  # noqa: ANN001, ANN202
        return backend.generate(prompt_ids, n=n, max_tokens=max_tokens, temperature=temperature, seed=seed,
                                stop=list(stop) or None)

    return generate_fn


def _manifest_start(out: Path, cfg: DictConfig, argv: list[str], envs: dict[str, tuple[Environment, int]],
                    model_dir: Path) -> None:
    from rlexp.tracking.manifest import fingerprint_examples, hash_files, write_start_manifest

    datasets = {}
    for name, (env, _) in envs.items():
        samples = env.eval_samples()
        datasets[name] = {"environment": env.name, "dataset": env.cfg.dataset, "revision": env.cfg.revision,
                          "split": env.cfg.eval_split, "n": len(samples),
                          "sha256": fingerprint_examples([(s.id, s.problem.prompt, s.answer) for s in samples])}
    write_start_manifest(out, cfg, ["rlexp", "eval", *argv], seeds={"eval": int(cfg.seed)},
                         extra={"kind": "eval", "datasets": datasets,
                                "model": {"dir": str(model_dir), "sha256": hash_files(model_dir)}})


def run(cfg: DictConfig, argv: list[str]) -> list[BenchmarkResult]:
    from rlexp.evals.results import write_samples, write_tables
    from rlexp.tracking.manifest import finish_manifest

    envs = benchmark_envs(cfg)
    for env, _ in envs.values():  # load every dataset before any model work: fail fast on missing data
        env.eval_samples()
    model_dir, label = model_dir_of(cfg)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(cfg.out or f"results/eval-{label}-{'+'.join(envs)}-{stamp}")
    _manifest_start(out, cfg, argv, envs, model_dir)
    results: list[BenchmarkResult] = []
    status = "failed"
    try:
        from rlexp.actors.generator import build_backend  # imported late: data and model errors come first
        from rlexp.models.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(model_dir)
        backend = build_backend(str(cfg.backend), str(model_dir), tokenizer, int(cfg.seed))
        for name, (env, max_tokens) in envs.items():
            res = run_benchmark(name, env, make_generate_fn(backend, env.stop), tokenizer, n=int(cfg.n),
                                max_tokens=max_tokens, temperature=float(cfg.temperature), seed=int(cfg.seed),
                                max_samples=cfg.max_samples, batch_size=int(cfg.batch_size))
            write_samples(out / f"samples_{name}.jsonl", res.records)
            results.append(res)
            log.info("%s: accuracy %.4f [%.4f, %.4f], unparseable %.4f, %d problems in %.1fs", name,
                     res.metrics["accuracy"], res.metrics["ci_low"], res.metrics["ci_high"],
                     res.metrics["unparseable"], int(res.metrics["n_problems"]), res.seconds)
        header = f"# rlexp eval: {label}\n\nCommand: `rlexp eval {' '.join(argv)}`; model folder `{model_dir}`.\n"
        md, csv_path = write_tables(out, results, header)
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


def _checkpoint_error() -> type[Exception]:
    try:
        from rlexp.models.hf import CheckpointError

        return CheckpointError
    except ImportError:  # pragma: no cover
        return FileNotFoundError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    overrides, flags = _split_flags(argv)
    if "out" in flags:
        overrides.append(f"out={flags['out']}")
    try:
        cfg = compose(overrides, flags.get("config-dir", DEFAULT_CONF))
        run(cfg, argv)
    except (DatasetMissing, FileNotFoundError, _checkpoint_error()) as e:
        print(f"rlexp eval: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
