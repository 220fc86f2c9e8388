#!/usr/bin/env bash
# Stops the bench's own PostgreSQL (the cluster in $PEERS_WORK/pg, port $PEERS_PORT) and
# nothing else.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
peers_pg stop
