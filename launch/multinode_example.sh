#!/usr/bin/env bash
# The seed's multi-node run, ready to go: 4 nodes x 8 GPUs = 32 GPUs, all in use:
#   16 trainer ranks = TP 4 x PP 2 x DP 2 with ZeRO-1 (ColossalAI HybridParallelPlugin, bf16), packed on 2 nodes,
#   each TP group inside one node (coati/cluster/placement.py), and 16 vLLM inferencers on the other 2.
# Run it on a node of the cluster (normally the head) once every node has joined:
#   launch/multinode_example.sh HEAD_IP[:PORT] MODEL_DIR TRAIN_DATA [more rl_example.py flags, which win]
# MODEL_DIR and TRAIN_DATA must be readable at the same paths on every node (a shared filesystem), and so must
# -sd (default runs/): every trainer rank writes its part of each checkpoint there.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/ray_env.sh
[ $# -ge 3 ] || { echo "usage: $0 HEAD_IP[:PORT] MODEL_DIR TRAIN_DATA [rl_example.py flags]" >&2; exit 2; }
head=$1 model=$2 data=$3
shift 3
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
exec "$PYTHON" rl_example.py --master_address "$head" -m "$model" -d "$data" \
    -t 16 -tp 4 -pp 2 -zero 1 --plugin colossalai --precision bf16 \
    -i 16 -b vllm \
    -a GRPO -rt boxed -s "Please reason step by step, and put your final answer within \\boxed{}." \
    -g 2 -ibs 1 -imbs 1 -tbs 2 -tMbs 1 -tmbs 2 -e 2 -si 50 \
    -p GRPO-Train-Align-Debug "$@"
