#!/usr/bin/env bash
# A private PostgreSQL cluster for jobs-engine development and tests, kept
# outside the repo so a fresh clone / `git clean` never touches it.
#
#   scripts/postgres.sh start|stop|status|url
#
#   JOBS_PG_DIR   data dir   (default $HOME/.cache/jobs-engine/pg)
#   JOBS_PG_PORT  TCP port   (default 54329), 127.0.0.1 only, trust auth,
#                 superuser "postgres", database "jobs_engine".
#
# `start` is idempotent and prints the DATABASE_URL as its last line.
set -euo pipefail

# runuser lives in /usr/sbin, which a minimal (CI) PATH may lack.
PATH="$PATH:/usr/sbin:/sbin"
HOME="${HOME:-$(cd ~ && pwd)}"
PGDIR="$(realpath -m "${JOBS_PG_DIR:-$HOME/.cache/jobs-engine/pg}")"
PORT="${JOBS_PG_PORT:-54329}"
DB=jobs_engine
URL="postgres://postgres@127.0.0.1:$PORT/$DB"
PARENT="$(dirname "$PGDIR")"
SOCKDIR="$PARENT/run"        # unix socket dir, beside the data dir
LOG="$PARENT/postgres.log"
BIN=

die() { echo "postgres.sh: $*" >&2; exit 1; }

# Server binaries: the version that made an existing data dir, else the
# newest installed (Debian puts them in /usr/lib/postgresql/N/bin).
find_bindir() {
    local d=
    if [[ -r "$PGDIR/PG_VERSION" ]]; then
        d="/usr/lib/postgresql/$(cat "$PGDIR/PG_VERSION")/bin"
    fi
    if [[ ! -x "$d/initdb" ]]; then
        d="$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n1)"
    fi
    [[ -x "$d/initdb" ]] && echo "$d"
}

# A fresh machine may lack the server: install the Debian package (root).
need_bin() {
    BIN="$(find_bindir)" && return 0
    echo "postgres.sh: no PostgreSQL server found, installing it with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q postgresql >&2
    BIN="$(find_bindir)" || die "postgresql installed but no /usr/lib/postgresql/*/bin/initdb"
}

# initdb/postgres refuse to run as root: run the server as the `postgres`
# OS user then. From / so it never trips over an unreadable cwd.
if [[ $EUID -eq 0 ]]; then
    PGUSER_OS=postgres
    as_pg() { (cd / && runuser -u "$PGUSER_OS" -- "$@"); }
else
    PGUSER_OS="$(id -un)"
    as_pg() { "$@"; }
fi

# The server user must be able to traverse every parent of the data dir.
# As root the default lives under /root (mode 700): grant search (x) only,
# to the postgres user alone when ACLs are available.
ensure_traversable() {
    local d="" part
    local -a parts
    [[ $EUID -eq 0 ]] || return 0
    IFS=/ read -ra parts <<<"${PARENT#/}"
    for part in "${parts[@]}"; do   # top-down: a parent blocks its children
        d="$d/$part"
        runuser -u "$PGUSER_OS" -- test -x "$d" 2>/dev/null && continue
        if command -v setfacl >/dev/null 2>&1 && setfacl -m "u:$PGUSER_OS:x" "$d" 2>/dev/null; then
            echo "postgres.sh: let $PGUSER_OS traverse $d (ACL u:$PGUSER_OS:x)" >&2
        else
            chmod o+x "$d"
            echo "postgres.sh: let $PGUSER_OS traverse $d (chmod o+x)" >&2
        fi
    done
}

is_running() {
    [[ -n "$BIN" ]] || BIN="$(find_bindir)" || return 1  # no server installed
    as_pg "$BIN/pg_ctl" status -D "$PGDIR" >/dev/null 2>&1
}

write_conf() {
    # Rewritten at every start so changed settings here take effect.
    # fsync/synchronous_commit stay ON: benchmarks must measure real durability.
    as_pg tee "$PGDIR/jobs_engine.conf" >/dev/null <<EOF
# Managed by scripts/postgres.sh -- edits are overwritten at start.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCKDIR'
max_connections = 200
fsync = on
synchronous_commit = on
full_page_writes = on
shared_buffers = 128MB
timezone = 'UTC'
log_timezone = 'UTC'
lc_messages = 'C'
log_lock_waits = on
log_min_duration_statement = 1000
EOF
    if ! grep -q "^include_if_exists = 'jobs_engine.conf'" "$PGDIR/postgresql.conf"; then
        echo "include_if_exists = 'jobs_engine.conf'" | as_pg tee -a "$PGDIR/postgresql.conf" >/dev/null
    fi
}

wait_ready() {
    local _
    for _ in $(seq 1 60); do
        "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres && return 0
        sleep 0.5
    done
    return 1
}

ensure_db() {
    local psql=("$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tA)
    if [[ "$("${psql[@]}" -c "select 1 from pg_database where datname = '$DB'")" != 1 ]]; then
        "${psql[@]}" -c "create database $DB"
    fi
}

start() {
    need_bin
    if is_running; then
        wait_ready || die "server running but not answering on 127.0.0.1:$PORT (log: $LOG)"
        ensure_db
        echo "$URL"
        return 0
    fi

    mkdir -p "$PARENT" "$SOCKDIR"
    touch "$LOG"
    if [[ $EUID -eq 0 ]]; then
        chown "$PGUSER_OS" "$SOCKDIR" "$LOG"
        ensure_traversable
    fi

    if [[ ! -s "$PGDIR/PG_VERSION" ]]; then
        mkdir -p "$PGDIR"
        chmod 700 "$PGDIR"
        if [[ $EUID -eq 0 ]]; then chown "$PGUSER_OS" "$PGDIR"; fi
        # -U postgres: same superuser name whoever runs it; trust: dev only,
        # safe because we only listen on 127.0.0.1 and a private socket dir.
        as_pg "$BIN/initdb" -D "$PGDIR" -U postgres --auth=trust \
            -E UTF8 --locale=C.UTF-8 >"$PARENT/initdb.log" 2>&1 \
            || { cat "$PARENT/initdb.log" >&2; die "initdb failed"; }
    elif [[ "$(cat "$PGDIR/PG_VERSION")" != "$(basename "$(dirname "$BIN")")" ]]; then
        echo "postgres.sh: $PGDIR was made by PostgreSQL $(cat "$PGDIR/PG_VERSION"), server is $BIN" >&2
        echo "postgres.sh: remove it (scripts/postgres.sh stop; rm -rf $PGDIR) to re-create" >&2
        exit 1
    fi

    write_conf
    if ! as_pg "$BIN/pg_ctl" start -D "$PGDIR" -l "$LOG" -w -t 60 >/dev/null; then
        tail -n 20 "$LOG" >&2
        die "could not start the server (log: $LOG)"
    fi
    wait_ready || { tail -n 20 "$LOG" >&2; die "server not ready on 127.0.0.1:$PORT"; }
    ensure_db
    echo "$URL"
}

stop() {
    if is_running; then
        as_pg "$BIN/pg_ctl" stop -D "$PGDIR" -m fast -w -t 60 >/dev/null
        echo "stopped ($PGDIR)"
    else
        echo "not running ($PGDIR)"
    fi
}

status() {
    if is_running; then
        echo "running: $URL ($PGDIR)"
    else
        echo "stopped ($PGDIR)"
        return 3  # same as `pg_ctl status` for "not running"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    url) echo "$URL" ;;
    *) echo "usage: $0 start|stop|status|url" >&2; exit 2 ;;
esac
