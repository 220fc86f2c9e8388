#!/usr/bin/env bash
# Fail when a tracked file names a path of one machine (a home folder, a pyenv version, a
# venv made by hand) or a document outside the repository: such a file works only where
# that path exists. Tests start Python with sys.executable and find files relative to the
# repository.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PATTERN='/work/|/root/|/home/[A-Za-z]|/Users/[A-Za-z]|\.pyenv/versions/|venv3[0-9]+|shared/(SPEC|BENCH|STYLE|seeds)'
if git rev-parse --git-dir >/dev/null 2>&1; then
    found="$(git grep -nIE "$PATTERN" -- . ':!scripts/check-portable.sh' || true)"
else
    found="$(grep -rnIE "$PATTERN" --exclude-dir=.venv\* --exclude-dir=.git \
             --exclude=check-portable.sh . || true)"
fi
if [[ -n "$found" ]]; then
    echo "check-portable: paths of one machine or outside the repository:" >&2
    echo "$found" >&2
    exit 1
fi
echo "check-portable: no machine paths"
