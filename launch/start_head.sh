#!/usr/bin/env bash
# Start the Ray head on this node. Usage: launch/start_head.sh [PORT] [extra `ray start` flags, e.g. --num-gpus 8]
#
# Token authentication is on (RAY_AUTH_MODE=token; set RAY_AUTH_MODE=disabled to opt out on a trusted network).
# The token is RAY_AUTH_TOKEN when set, else ~/.ray/auth_token (created here if missing). Every worker node and
# the training driver need the same token and RAY_AUTH_MODE=token: a shared home directory already shares the
# file; otherwise copy ~/.ray/auth_token to each node, or export RAY_AUTH_TOKEN there (`ray get-auth-token`
# prints it).
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:-6379}
shift || true
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
    .venv/bin/ray get-auth-token --generate >/dev/null  # creates ~/.ray/auth_token unless it exists
fi
ip=$(hostname -I | awk '{print $1}')
.venv/bin/ray start --head --port="$port" --include-dashboard=false --disable-usage-stats "$@"
echo
echo "head started at $ip:$port (token authentication: $RAY_AUTH_MODE)"
echo "each worker node: launch/start_worker.sh $ip:$port   (with this node's token: same ~/.ray/auth_token or RAY_AUTH_TOKEN)"
echo "check:            .venv/bin/python -m coati.cluster.connect $ip:$port --nodes N"
echo "train from here:  RAY_AUTH_MODE=$RAY_AUTH_MODE .venv/bin/python rl_example.py --master_address $ip:$port -m MODEL -d DATA ..."
