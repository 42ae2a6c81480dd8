#!/usr/bin/env bash
# Start the Ray head on this node. Usage: launch/start_head.sh [PORT] [extra `ray start` flags, e.g. --num-gpus 8]
# PORT (default 6379) is taken only when the first argument is a number; `--port N` among the flags works too.
# The `ray` run is COATI_RAY, the active environment's, or the checkout's .venv (launch/ray_env.sh).
#
# Token authentication is on (RAY_AUTH_MODE=token; set RAY_AUTH_MODE=disabled to opt out on a trusted network).
# The token is RAY_AUTH_TOKEN when set, else ~/.ray/auth_token (created here if missing). Every worker node and
# the training driver need the same token and RAY_AUTH_MODE=token: a shared home directory already shares the
# file; otherwise copy ~/.ray/auth_token to each node, or export RAY_AUTH_TOKEN there (`ray get-auth-token`
# prints it).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/ray_env.sh
port=6379
if [ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]]; then
    port=$1
    shift
fi
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do  # a --port among the flags wins over the default
    case "${args[i]}" in
        --port=*) port=${args[i]#--port=}; unset 'args[i]' ;;
        --port) port=${args[i + 1]:-}; unset 'args[i]' 'args[i + 1]'; i=$((i + 1)) ;;
    esac
done
[[ $port =~ ^[0-9]+$ ]] || { echo "error: the port must be a number, got '$port'" >&2; exit 2; }
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ -z "${RAY_AUTH_TOKEN_PATH:-}" ]; then
    "$RAY" get-auth-token --generate >/dev/null  # creates ~/.ray/auth_token unless it exists
fi
ip=$(hostname -I 2>/dev/null | awk '{print $1}' || true)
ip=${ip:-$(hostname)}
"$RAY" start --head --port="$port" --include-dashboard=false --disable-usage-stats "${args[@]}"
echo
echo "head started at $ip:$port (token authentication: $RAY_AUTH_MODE)"
echo "each worker node: launch/start_worker.sh $ip:$port   (with this node's token: same ~/.ray/auth_token or RAY_AUTH_TOKEN)"
echo "check:            $PYTHON -m coati.cluster.connect $ip:$port --nodes N"
echo "train from here:  RAY_AUTH_MODE=$RAY_AUTH_MODE $PYTHON rl_example.py --master_address $ip:$port -m MODEL -d DATA ..."
