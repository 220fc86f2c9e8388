#!/usr/bin/env bash
# Build the wheels the image installs (docker/wheels/): the engine from this checkout with
# the extras the demo uses, and gunicorn. Run with the Python of the image's version.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
rm -rf "$ROOT/docker/wheels"
"$PY" -m pip wheel -q --wheel-dir "$ROOT/docker/wheels" \
    "$ROOT[postgres,api,metrics,kafka]" gunicorn
ls "$ROOT/docker/wheels" | wc -l
