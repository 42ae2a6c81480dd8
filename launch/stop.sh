#!/usr/bin/env bash
# Stop Ray on this node (head or worker).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ray stop --force
