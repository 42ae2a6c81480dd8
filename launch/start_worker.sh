#!/usr/bin/env bash
# Join a running Ray cluster. Usage: launch/start_worker.sh HEAD_IP[:PORT] [extra `ray start` flags, e.g. --num-gpus 8]
# Every node needs the same checkout at the same path and the same environment (scripts/setup.sh's .venv, or
# COATI_RAY / an active virtualenv: launch/ray_env.sh), and the head's
# token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; see launch/start_head.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/ray_env.sh
[ $# -ge 1 ] || { echo "usage: $0 HEAD_IP[:PORT] [ray start flags]" >&2; exit 2; }
address=$1
shift
case "$address" in *:*) ;; *) address="$address:6379" ;; esac
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ] && [ ! -f "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]; then
    echo "error: no Ray token on this node: copy the head's ~/.ray/auth_token here, or export RAY_AUTH_TOKEN" \
         "(\`ray get-auth-token\` on the head prints it)" >&2
    exit 2
fi
"$RAY" start --address="$address" --disable-usage-stats "$@"
