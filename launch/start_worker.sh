#!/usr/bin/env bash
# Join an existing Ray cluster. Usage: launch/start_worker.sh HEAD_IP:PORT [extra `ray start` flags...]
# Every node needs the same checkout at the same path and the same .venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 HEAD_IP:PORT [ray start flags]" >&2; exit 2; }
address=$1
shift
.venv/bin/ray start --address="$address" "$@"
