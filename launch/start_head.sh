#!/usr/bin/env bash
# Start the Ray head on this node. Usage: launch/start_head.sh [PORT] [extra `ray start` flags...]
# Then run training from this node with RAY_ADDRESS set (printed below), e.g.
#   RAY_ADDRESS=$(hostname -I | awk '{print $1}'):6379 .venv/bin/python rl_example.py -m MODEL -d DATA ...
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-6379}
shift || true
.venv/bin/ray start --head --port="$port" --include-dashboard=false "$@"
echo "head started; workers join with: launch/start_worker.sh $(hostname -I | awk '{print $1}'):$port"
echo "train with: RAY_ADDRESS=$(hostname -I | awk '{print $1}'):$port .venv/bin/python rl_example.py ..."
