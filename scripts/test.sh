#!/usr/bin/env bash
# The whole test suite, from nothing: venv, PostgreSQL, chromium, lint, the type check,
# the portability check, the documentation site (mkdocs.yml), the package check (sdist and
# wheel, twine), tests on PostgreSQL (unit, db, real processes, Kafka, browser, the
# host-project install), then the unit/db tests again on SQLite with the newest Django and
# with Django 5.2 LTS, then docker/ (scripts/docker-test.sh).
#
#   scripts/test.sh [pytest args...]     (args go to both pytest runs)
#   KEEP_PG=1 scripts/test.sh            keep a postgres we started running
#   JOBS_DOCKER_TEST=off scripts/test.sh  without the docker/ smoke test
#
# Every step runs even if an earlier one failed, so one run shows all
# breakage; the exit status is non-zero if any step failed. pytest's exit
# code 5 ("no tests collected") is a failure too: a suite that silently
# collects nothing must not pass.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PY="$(bash "$ROOT/scripts/bootstrap.sh" | tail -n1)" || { echo "FAIL  bootstrap" >&2; exit 1; }

# Start postgres unless it already runs; stop it at the end only if we
# started it, so a developer's running cluster is left alone.
if ! bash "$ROOT/scripts/postgres.sh" status >/dev/null 2>&1 && [[ "${KEEP_PG:-0}" != 1 ]]; then
    trap 'bash "$ROOT/scripts/postgres.sh" stop >/dev/null || true' EXIT
fi
# Ctrl-C: stop here (pytest exits 2 on SIGINT, which would not stop us).
trap 'echo "test.sh: interrupted" >&2; exit 130' INT TERM
PG_URL="$(bash "$ROOT/scripts/postgres.sh" start | tail -n1)" || {
    PG_URL=""
    echo "test.sh: could not start PostgreSQL; its tests count as failed" >&2
}

# The browser tests (tests/browser, PostgreSQL run) drive Debian's chromium through
# Playwright; Playwright's own browser download is not used. Install it when missing.
if [[ ! -x /usr/bin/chromium ]]; then
    if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "test.sh: installing chromium for the browser tests (apt-get)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq chromium; } >/dev/null 2>&1 \
            || echo "test.sh: installing chromium failed; the browser tests will fail" >&2
    else
        echo "test.sh: /usr/bin/chromium is missing (install Debian's chromium as root);" \
             "the browser tests will fail" >&2
    fi
fi

declare -a NAMES=() CODES=()
step() {  # step NAME CMD...: run, record the exit code, never abort
    local name="$1" rc=0
    shift
    echo "=== $name"
    "$@" || rc=$?
    NAMES+=("$name")
    CODES+=("$rc")
}

step "ruff" "$PY" -m ruff check .
step "mypy" "$PY" -m mypy  # jobs_engine and the docs hook, strict, django-stubs ([tool.mypy])
step "portable" bash "$ROOT/scripts/check-portable.sh"
# The documentation site (mkdocs.yml, docs/contributing.md): --strict fails on a broken link,
# a missing anchor or a page left out of the nav. Built into a temporary folder, not kept.
DOCS_SITE="$(mktemp -d)"
step "docs" "$PY" -m mkdocs build --strict --site-dir "$DOCS_SITE"
rm -rf "$DOCS_SITE"

# What PyPI would get: the sdist, and the wheel built from it (so a file the sdist leaves
# out fails here, not in a user's pip install), with the venv's setuptools (no download),
# into a directory of its own; then twine's check, warnings included, of their metadata
# (the README as the long description renders, the required fields are there).
package() {
    local out rc=0
    out="$(mktemp -d)"
    "$PY" -m build --no-isolation --outdir "$out" "$ROOT" >/dev/null || rc=$?
    if (( rc == 0 )); then
        "$PY" -m twine check --strict "$out"/*.tar.gz "$out"/*.whl || rc=$?
    fi
    rm -rf "$out"
    return "$rc"
}
step "package" package

if [[ -n "$PG_URL" ]]; then
    step "pytest (postgres)" env DATABASE_URL="$PG_URL" \
        "$PY" -m pytest -p no:cacheprovider "$@"
else
    NAMES+=("pytest (postgres)"); CODES+=("postgres did not start")
fi

step "pytest (sqlite, Django $("$PY" -c 'import django; print(django.get_version())'))" \
    env -u DATABASE_URL "$PY" -m pytest -p no:cacheprovider tests/unit tests/db "$@"

# The oldest supported Django (5.2 LTS), in a venv of its own.
if PY52="$(JOBS_VENV=.venv-django5.2 JOBS_DJANGO='Django>=5.2,<5.3' \
           bash "$ROOT/scripts/bootstrap.sh" | tail -n1)"; then
    step "pytest (sqlite, Django $("$PY52" -c 'import django; print(django.get_version())'))" \
        env -u DATABASE_URL "$PY52" -m pytest -p no:cacheprovider tests/unit tests/db "$@"
else
    NAMES+=("pytest (sqlite, Django 5.2)"); CODES+=("its venv could not be made")
fi

# docker/ with a real Docker daemon (about 7 minutes with nothing cached): the full run only,
# not when pytest arguments pick a subset. JOBS_DOCKER_TEST=off leaves it out.
if (( $# == 0 )) && [[ "${JOBS_DOCKER_TEST:-on}" != off ]]; then
    step "docker (scripts/docker-test.sh)" bash "$ROOT/scripts/docker-test.sh"
fi

echo "=== summary"
failed=0
for i in "${!NAMES[@]}"; do
    rc="${CODES[$i]}"
    if [[ "$rc" == 0 ]]; then
        echo "PASS  ${NAMES[$i]}"
        continue
    fi
    failed=1
    case "$rc" in
        5) why="exit 5: no tests collected" ;;
        [0-9]*) why="exit $rc" ;;
        *) why="$rc" ;;
    esac
    echo "FAIL  ${NAMES[$i]} ($why)"
done
exit "$failed"
