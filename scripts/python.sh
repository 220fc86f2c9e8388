#!/usr/bin/env bash
# Print the path of a Python >= 3.12 interpreter (with venv/ensurepip) to stdout.
#
#   scripts/python.sh            -> prints the path, exit 1 if none found
#   source scripts/python.sh     -> prints the path and sets JOBS_PYTHON,
#                                   returns 1 if none found (does not exit
#                                   the caller's shell nor change its options)
#
# Override the search with JOBS_PYTHON=/path/to/python.
# The default python3 on our Debian 12 machines is 3.11, which is too old.

_jobs_python_ok() {
    # Really run the candidate: pyenv shims exist on PATH even when the
    # version they name is not selected, and then they fail.
    "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 12))' \
        >/dev/null 2>&1
}

_jobs_find_python() {
    local c root
    local -a candidates=()

    [[ -n "${JOBS_PYTHON:-}" ]] && candidates+=("$JOBS_PYTHON")

    # pyenv installs, newest first; pyenv itself may be absent, the dir not.
    if command -v pyenv >/dev/null 2>&1; then
        root="$(pyenv root 2>/dev/null || true)"
    fi
    # HOME may be unset (CI); ~ then falls back to the passwd entry.
    root="${root:-${PYENV_ROOT:-${HOME:-$(cd ~ 2>/dev/null && pwd)}/.pyenv}}"
    if [[ -d "$root/versions" ]]; then
        while IFS= read -r c; do
            candidates+=("$c")
        done < <(printf '%s\n' "$root"/versions/*/bin/python3 | sort -rV)
    fi

    candidates+=(python3.14 python3.13 python3.12
                 /usr/local/bin/python3.13 /usr/local/bin/python3.12
                 /usr/bin/python3.13 /usr/bin/python3.12
                 python3 python)

    for c in "${candidates[@]}"; do
        if _jobs_python_ok "$c"; then
            # Resolve to the real interpreter (not a shim / bare name).
            "$c" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done

    {
        echo "jobs-engine needs Python >= 3.12; install python3.12 or pyenv (pyenv install 3.12),"
        echo "or set JOBS_PYTHON=/path/to/python3.12. Found only: $(python3 --version 2>&1 || echo 'no python3')"
    } >&2
    return 1
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
    # Sourced: no set -euo pipefail here, it would leak into the caller.
    if JOBS_PYTHON="$(_jobs_find_python)"; then
        export JOBS_PYTHON
        echo "$JOBS_PYTHON"
    else
        unset JOBS_PYTHON
        return 1
    fi
else
    set -euo pipefail
    _jobs_find_python || exit 1
fi
