#!/usr/bin/env bash
# Build the wheels the image installs (docker/wheels/): the engine from this checkout with
# the extras the demo uses, and gunicorn. Run with the Python of the image's version.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
# setuptools' scratch folder: a stale one would put deleted modules into the wheel.
rm -rf "$ROOT/docker/wheels" "$ROOT/build"
"$PY" -m pip wheel -q --wheel-dir "$ROOT/docker/wheels" \
    "$ROOT[postgres,api,metrics,kafka]" gunicorn
rm -rf "$ROOT/build"
ls "$ROOT/docker/wheels" | wc -l
