#!/usr/bin/env bash
# Zero-setup demo on SQLite (var/jobs_engine.sqlite3): venv, migrate, admin
# user, web server + workers in the background, a few demo jobs.
# Ctrl-C (or SIGTERM) stops both background processes cleanly.
#
# The demo's order events go to Kafka (kafka:demo.orders). Without a broker
# that target pauses and its rows wait, PENDING; KAFKA=1 also starts a local
# broker (scripts/kafka.sh, port JOBS_KAFKA_PORT, default 19092), creates the
# topic, and stops the broker on exit if this script started it.
#
#   scripts/run.sh            PORT=8001 scripts/run.sh            KAFKA=1 scripts/run.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
unset DATABASE_URL   # the demo is always the embedded SQLite database
PORT="${PORT:-8000}"

PY="$(bash "$ROOT/scripts/bootstrap.sh" | tail -n1)"
export DJANGO_DEBUG="${DJANGO_DEBUG:-1}"   # a local run: debug pages, the development key
"$PY" manage.py migrate --noinput
"$PY" manage.py demo_admin

PIDS=()
KAFKA_STARTED=0
# shellcheck disable=SC2317  # only reached through the traps below
cleanup() {
    trap - INT TERM EXIT
    if ((${#PIDS[@]})); then
        echo "run.sh: stopping web server and workers..." >&2
        kill -TERM "${PIDS[@]}" 2>/dev/null || true
        # Give workers time to finish/release their current job, then insist.
        local _ pid alive
        for _ in $(seq 1 50); do
            alive=0
            for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
            ((alive)) || break
            sleep 0.2
        done
        kill -KILL "${PIDS[@]}" 2>/dev/null || true
        wait "${PIDS[@]}" 2>/dev/null || true
    fi
    if ((KAFKA_STARTED)); then
        echo "run.sh: stopping the Kafka broker..." >&2
        bash "$ROOT/scripts/kafka.sh" stop >&2 || true
    fi
}
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
trap cleanup EXIT   # also on errors (set -e), e.g. enqueue_demo failing

if [[ "${KAFKA:-0}" == 1 ]]; then
    bash "$ROOT/scripts/kafka.sh" status >/dev/null 2>&1 || KAFKA_STARTED=1
    KAFKA_BOOTSTRAP_SERVERS="$(bash "$ROOT/scripts/kafka.sh" start | tail -n1)"
    export KAFKA_BOOTSTRAP_SERVERS
    bash "$ROOT/scripts/kafka.sh" topics --create --if-not-exists \
        --topic "${DEMO_ORDERS_TOPIC:-demo.orders}" --partitions 3 --replication-factor 1 >&2
    echo "run.sh: Kafka broker on $KAFKA_BOOTSTRAP_SERVERS" >&2
else
    # Say once, up front, why the order events will wait: the workers only log the
    # outage as a periodic warning. Python, not /dev/tcp: a 1 s connect timeout anywhere.
    KAFKA_SERVERS="${JOBS_KAFKA_BOOTSTRAP_SERVERS:-${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:19092}}"
    "$PY" -c '
import socket, sys
for server in sys.argv[1].split(","):
    host, _, port = server.strip().rpartition("://")[2].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
        sys.exit(0)
    except (OSError, ValueError):
        pass
sys.exit(1)' "$KAFKA_SERVERS" ||
        echo "run.sh: no Kafka broker on $KAFKA_SERVERS: the demo's order events wait," \
             "paused, until one is up (KAFKA=1 scripts/run.sh starts one)" >&2
fi

# --noreload: one process per child, so the kill above reaches the server
# itself (the autoreloader would add a grandchild), and the server does not
# restart on edits while the workers keep running old code.
"$PY" manage.py runserver --noreload "127.0.0.1:$PORT" &
PIDS+=($!)
"$PY" manage.py run_workers &
PIDS+=($!)

"$PY" manage.py enqueue_demo

cat <<EOF

  jobs-engine demo is running (SQLite: var/jobs_engine.sqlite3)
  Kafka:  ${KAFKA_BOOTSTRAP_SERVERS:-127.0.0.1:19092 (no broker started; KAFKA=1 starts one)}
  Admin:  http://127.0.0.1:$PORT/admin/   (credentials printed above)
  Ctrl-C to stop.

EOF

# Wait for Ctrl-C, or for either child to die (then stop the other too).
rc=0
wait -n "${PIDS[@]}" || rc=$?
echo "run.sh: a background process exited (status $rc); shutting down" >&2
exit "$rc"
