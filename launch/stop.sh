#!/usr/bin/env bash
# Stop Ray on this node (head or worker). Note: `ray stop` ends every Ray process of this user on the machine,
# local runs' clusters included.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/ray_env.sh
"$RAY" stop --force
