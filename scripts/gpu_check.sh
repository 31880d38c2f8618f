#!/usr/bin/env bash
# One command for the GPU figures rlexp cannot measure on CPU (docs/gpu_checks.md,
# docs/first_gpu_hour.md): rlexp's own Trainer and titan generator on one GPU, a Qwen3-0.6B-shaped
# random model in bf16 compute with fp32 master weights, a few sample -> train -> push steps; sized
# for one H100 (78 GiB) and cut at 470 s (an 8-minute slot).
#   bash scripts/gpu_check.sh             # on a CUDA machine: writes results/gpu_<device>.md
#                                         # (+ .json)
#   bash scripts/gpu_check.sh --tiny --device cpu --out /tmp/x.md   # same code paths, tiny, on CPU
#   bash scripts/gpu_check.sh --pack DIR  # copy TorchTitan, Hydra, omegaconf and their pure-Python
#                                         # deps to DIR (~30 MiB), to carry to a bare GPU image
#
# Needs torch and transformers. TorchTitan and Hydra/omegaconf (rlexp's model code and config types)
# are found, in order: already importable; a packed dir ($GPU_CHECK_SITE, default .cache/gpu_site,
# made by --pack on a machine with rlexp's venv); wheels in $GPU_CHECK_WHEELS (default
# .cache/gpu_wheels), installed with --no-index --no-deps into a temp dir. Monarch is not needed
# (scripts/gpu_check.py stands in for it on one rank). No network is used. The run is cut at
# $GPU_CHECK_TIMEOUT seconds (default 470).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [[ -n "${PYTHON:-}" ]]; then
  PY=$PYTHON
elif [[ -x .venv/bin/python ]] && .venv/bin/python -c "import torch" 2>/dev/null; then
  PY=.venv/bin/python
else
  PY=$(command -v python3 || command -v python || true)
fi
if [[ -z "$PY" ]]; then
  echo "gpu_check: no python found; set PYTHON=/path/to/python (one with torch and" \
       "transformers)" >&2
  exit 2
fi

PACKED=(torchtitan tyro docstring_parser spmd_types typeguard rich pygments markdown_it mdurl dill
        hydra omegaconf antlr4)

if [[ "${1:-}" == "--pack" ]]; then
  dest=${2:?"usage: bash scripts/gpu_check.sh --pack DIR"}
  site=$("$PY" -c \
    "import torchtitan, os; print(os.path.dirname(os.path.dirname(torchtitan.__file__)))") || {
    echo "gpu_check: --pack needs a python where torchtitan imports (rlexp's venv)" >&2; exit 2; }
  mkdir -p "$dest"
  for pkg in "${PACKED[@]}"; do
    [[ -d "$site/$pkg" ]] || { echo "gpu_check: $pkg not in $site, not packed"; continue; }
    rm -rf "${dest:?}/$pkg"
    cp -r "$site/$pkg" "$dest/" && cp -r "$site/$pkg"-*.dist-info "$dest/" 2>/dev/null || true
  done
  find "$dest" -name __pycache__ -type d -prune -exec rm -rf {} +
  echo "gpu_check: packed $(du -sh "$dest" | cut -f1) into $dest; carry it and set" \
       "GPU_CHECK_SITE=$dest (the default .cache/gpu_site needs no variable)"
  exit 0
fi

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import torchtitan, hydra, omegaconf" 2>/dev/null; then
  site=${GPU_CHECK_SITE:-.cache/gpu_site}
  wheels=${GPU_CHECK_WHEELS:-.cache/gpu_wheels}
  if [[ -d "$site/torchtitan" ]]; then
    # after the image's own packages: its versions win
    export PYTHONPATH="$PYTHONPATH:$(cd "$site" && pwd)"
    echo "gpu_check: using TorchTitan and Hydra from $site" >&2
  elif compgen -G "$wheels/*.whl" >/dev/null; then
    tmp=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --target "$tmp" "$wheels"/*.whl
    export PYTHONPATH="$PYTHONPATH:$tmp"
    echo "gpu_check: installed $(ls "$wheels"/*.whl | wc -l) carried wheel(s) from $wheels into" \
         "$tmp" >&2
  fi
  "$PY" -c "import torchtitan, hydra, omegaconf" 2>/dev/null || {
    echo "gpu_check: torchtitan, hydra or omegaconf is not importable by $PY and neither $site" \
         "nor $wheels has them: run \`bash scripts/gpu_check.sh --pack $site\` on a machine with" \
         "rlexp's venv and carry $site" >&2
    exit 2; }
fi
"$PY" -c "import transformers" 2>/dev/null || {
  echo "gpu_check: transformers is not importable by $PY; install it or carry its wheel in" \
       "${GPU_CHECK_WHEELS:-.cache/gpu_wheels}" >&2
  exit 2; }

exec timeout --signal=TERM --kill-after=10 "${GPU_CHECK_TIMEOUT:-470}" \
  "$PY" scripts/gpu_check.py --command "bash scripts/gpu_check.sh $*" "$@"
