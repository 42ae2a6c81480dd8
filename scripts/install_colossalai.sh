#!/usr/bin/env bash
# Install ColossalAI 0.5.0 into a virtual environment without letting it move torch or transformers.
#   bash scripts/install_colossalai.sh [VENV]      (default: .venv)
# colossalai goes in with --no-deps (its metadata pins torch<=2.5.1 / transformers==4.51.3); the few
# runtime dependencies it really imports come from requirements/colossalai.txt under the CPU constraints.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
source scripts/venv_install.sh
venv_install "$VENV" --no-deps colossalai==0.5.0
venv_install "$VENV" -c requirements/constraints-cpu.txt -r requirements/colossalai.txt
"$VENV/bin/python" - <<'PY'
import warnings
warnings.filterwarnings("ignore")
import torch, transformers
assert torch.__version__.startswith("2.13.0"), f"torch moved to {torch.__version__}; this project needs 2.13.0"
assert transformers.__version__.startswith("5.19."), f"transformers moved to {transformers.__version__}"
import colossalai, colossalai.booster.plugin, colossalai.shardformer.policies.qwen2  # noqa: F401
print(f"install_colossalai: ok (colossalai {colossalai.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__})")
PY
