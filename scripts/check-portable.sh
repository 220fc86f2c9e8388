#!/usr/bin/env bash
# Fail when a tracked file names a path of one machine (a home folder, a pyenv version, a
# venv made or linked by hand) or a document outside the repository: such a file works only where
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
# A tracked symbolic link to an absolute path (a venv linked in by hand) names one machine
# too; git grep reads the working tree, where such a link may have become a folder.
if git rev-parse --git-dir >/dev/null 2>&1; then
    while IFS=$'\t' read -r mode_and_object path; do
        [[ "$mode_and_object" == 120000* ]] || continue
        target="$(git cat-file -p ":$path")"
        if [[ "$target" == /* ]]; then
            found+="${found:+$'\n'}$path: a link to $target"
        fi
    done < <(git ls-files -s)
fi
if [[ -n "$found" ]]; then
    echo "check-portable: paths of one machine or outside the repository:" >&2
    echo "$found" >&2
    exit 1
fi
echo "check-portable: no machine paths"
