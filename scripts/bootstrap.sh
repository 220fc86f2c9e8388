#!/usr/bin/env bash
# Create/refresh the repo's .venv (Python >= 3.12) and install jobs-engine
# editable with its [test] extra. Quiet on success; the last line printed is
# the venv's python, so callers can do: PY="$(scripts/bootstrap.sh | tail -n1)".
#
#   JOBS_VENV=.venv-django5.2 JOBS_DJANGO='Django>=5.2,<5.3' scripts/bootstrap.sh
#       another venv, with Django pinned (CI runs the SQLite suite on 5.2 LTS too)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/${JOBS_VENV:-.venv}"
VPY="$VENV/bin/python"
DJANGO_PIN="${JOBS_DJANGO:-}"

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# Recreate the venv if it is missing, broken (e.g. its base interpreter was
# removed) or older than 3.12 (e.g. made by hand with Debian's python3 3.11).
if ! "$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
    PY="$(bash "$ROOT/scripts/python.sh")"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
fi

# Reinstall only when pyproject.toml or the version (jobs_engine.__version__, which the
# installed metadata copies) changed: their hash names the stamp.
SHA="$( (cat "$ROOT/pyproject.toml"; grep '^__version__' "$ROOT/jobs_engine/__init__.py"
         echo "$DJANGO_PIN") | sha1sum | cut -d' ' -f1)"
STAMP="$VENV/.installed-$SHA"
# editable_mode=compat: a plain .pth pointing at the repo. The default
# (lenient) mode snapshots the package layout at install time, so a package
# that gains its __init__.py later stays a namespace package and Django
# refuses it ("has multiple filesystem locations"). compat is deprecated in
# setuptools; fall back to the default mode once it is gone.
if [[ ! -e "$STAMP" ]]; then
    PIN=()
    [[ -n "$DJANGO_PIN" ]] && PIN=("$DJANGO_PIN")
    (cd "$ROOT" && { "$VPY" -m pip install -q -e '.[test]' "${PIN[@]}" \
                        --config-settings editable_mode=compat 2>/dev/null \
                     || "$VPY" -m pip install -q -e '.[test]' "${PIN[@]}"; })
    rm -f "$VENV"/.installed-*
    touch "$STAMP"
fi

echo "$VPY"
