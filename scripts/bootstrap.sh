#!/usr/bin/env bash
# Create/refresh the repo's .venv (Python >= 3.12) and install jobs-engine
# editable with its [test] extra. Quiet on success; the last line printed is
# the venv's python, so callers can do: PY="$(scripts/bootstrap.sh | tail -n1)".
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# Recreate the venv if it is missing, broken (e.g. its base interpreter was
# removed) or older than 3.12 (e.g. made by hand with Debian's python3 3.11).
if ! "$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
    PY="$(bash "$ROOT/scripts/python.sh")"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
fi

# Reinstall only when pyproject.toml changed (its hash names the stamp).
SHA="$(sha1sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
STAMP="$VENV/.installed-$SHA"
# editable_mode=compat: a plain .pth pointing at the repo. The default
# (lenient) mode snapshots the package layout at install time, so a package
# that gains its __init__.py later stays a namespace package and Django
# refuses it ("has multiple filesystem locations"). compat is deprecated in
# setuptools; fall back to the default mode once it is gone.
if [[ ! -e "$STAMP" ]]; then
    (cd "$ROOT" && { "$VPY" -m pip install -q -e '.[test]' \
                        --config-settings editable_mode=compat 2>/dev/null \
                     || "$VPY" -m pip install -q -e '.[test]'; })
    rm -f "$VENV"/.installed-*
    touch "$STAMP"
fi

echo "$VPY"
