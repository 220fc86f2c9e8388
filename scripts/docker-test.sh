#!/usr/bin/env bash
# Smoke test of docker/ with a real Docker daemon: build the images, bring the whole system
# up (PostgreSQL, Kafka, migrate, web, 3 fast, 2 long, 2 schedule workers), wait for health,
# then take it down with its volumes. Starts its own dockerd (vfs, private socket) when no
# daemon answers, and stops it after. Images come from Debian's packages and the Kafka jars
# (no registry is reachable here): see docker/local/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/jobs-engine/docker"
PROJECT=jobs-engine-smoke
note() { echo "docker-test: $*" >&2; }

missing=()
for tool in dockerd:docker.io docker-compose:docker-compose debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if (( ${#missing[@]} )); then
    note "installing ${missing[*]} with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
fi

RUN_DIR="$(mktemp -d)"
DAEMON_PID=
cleanup() {
    [[ -n "${COMPOSE_UP:-}" ]] && compose down -v --remove-orphans >&2 || true
    if [[ -n "$DAEMON_PID" ]]; then
        kill "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
    fi
    rm -rf "$RUN_DIR"
}
trap cleanup EXIT
if ! docker info >/dev/null 2>&1; then
    note "starting dockerd (vfs) on a private socket"
    mkdir -p "$CACHE/data"
    dockerd --storage-driver=vfs --host "unix://$RUN_DIR/docker.sock" --data-root "$CACHE/data" \
        --exec-root "$RUN_DIR/exec" --pidfile "$RUN_DIR/docker.pid" >"$RUN_DIR/dockerd.log" 2>&1 &
    DAEMON_PID=$!
    export DOCKER_HOST="unix://$RUN_DIR/docker.sock"
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { cat "$RUN_DIR/dockerd.log" >&2; exit 1; }
fi

note "building the images"
bash "$ROOT/scripts/docker-wheels.sh" >/dev/null
BASE="$(bash "$ROOT/scripts/docker-base-image.sh" jobs-engine-base:trixie \
        python3,python3-venv,ca-certificates)"
PG_BASE="$(bash "$ROOT/scripts/docker-base-image.sh" jobs-engine-postgres-base:trixie \
           postgresql,ca-certificates)"
JRE="$(bash "$ROOT/scripts/docker-base-image.sh" jobs-engine-jre:trixie \
       openjdk-21-jre-headless,ca-certificates)"
docker build -q -f "$ROOT/docker/Dockerfile" --build-arg "BASE_IMAGE=$BASE" \
    -t jobs-engine-demo:smoke "$ROOT" >/dev/null
docker build -q -f "$ROOT/docker/local/postgres.Dockerfile" --build-arg "BASE_IMAGE=$PG_BASE" \
    -t jobs-engine-postgres:local "$ROOT/docker/local" >/dev/null
KAFKA_LIB="$(bash "$ROOT/scripts/kafka.sh" classpath)"
mkdir -p "$RUN_DIR/kafka"
cp -r "${KAFKA_LIB%/\*}" "$RUN_DIR/kafka/lib"
cp "$ROOT/docker/local/kafka.Dockerfile" "$ROOT/docker/local/kafka-entrypoint.sh" \
   "$ROOT/docker/local/kafka-topics.sh" "$ROOT/docker/local/kafka-console-consumer.sh" \
   "$RUN_DIR/kafka/"
docker build -q -f "$RUN_DIR/kafka/kafka.Dockerfile" --build-arg "BASE_IMAGE=$JRE" \
    -t jobs-engine-kafka:local "$RUN_DIR/kafka" >/dev/null

export APP_IMAGE=jobs-engine-demo:smoke POSTGRES_IMAGE=jobs-engine-postgres:local \
       KAFKA_IMAGE=jobs-engine-kafka:local WEB_PORT="${WEB_PORT:-18000}" \
       DJANGO_SECRET_KEY="smoke-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
compose() { docker-compose -f "$ROOT/docker/compose.yaml" -p "$PROJECT" "$@"; }

note "compose up: 3 fast, 2 long, 2 schedule workers"
COMPOSE_UP=1
compose up -d --scale fast=3 --scale long=2 --scale schedules=2 >&2
# Every container healthy (those without a health check: running; migrate: exited 0).
healthy() {
    local id state bad=0
    for id in $(compose ps -q); do
        state="$(docker inspect -f '{{.Name}} {{.State.Status}}/{{.State.ExitCode}}/{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")"
        case "${state##* }" in
            exited/0/*|running/*/healthy|running/*/none) ;;
            *) bad=1; [[ "${1:-}" == show ]] && echo "$state" >&2 ;;
        esac
    done
    return "$bad"
}
started=$SECONDS
until healthy; do
    if (( SECONDS - started > 300 )); then
        healthy show || true; compose ps >&2; note "not healthy in 300 s"; exit 1
    fi
    sleep 2
done
note "healthy $((SECONDS - started)) s after up"
compose ps >&2
note "every container is up and healthy"

note "200 order events through the web container (50 orders, 4 versions each)"
compose exec -T web python manage.py enqueue_demo --orders 50 >&2
sql() { compose exec -T postgres psql -U jobs -d jobs -Atc "$1"; }
started=$SECONDS
until [[ "$(sql "SELECT COUNT(*) FROM jobs_engine_job WHERE target = 'kafka:demo.orders'")" == 0 ]]; do
    if (( SECONDS - started > 180 )); then
        note "order events still waiting after 180 s"
        sql "SELECT status, last_error, COUNT(*) FROM jobs_engine_job GROUP BY 1, 2" >&2
        sql "SELECT owner, COUNT(*) FROM jobs_engine_partition GROUP BY owner" >&2
        sql "SELECT target, reason FROM jobs_engine_targetpause" >&2
        compose logs --tail 15 fast >&2
        exit 1
    fi
    sleep 2
done
compose exec -T kafka /opt/kafka/bin/kafka-console-consumer.sh --bootstrap-server localhost:9092 \
    --topic demo.orders --from-beginning --timeout-ms 20000 --property print.key=true \
    >"$RUN_DIR/orders.txt" 2>/dev/null || true
python3 - "$RUN_DIR/orders.txt" <<'PY'
import json
import sys

seen = {}
for line in open(sys.argv[1]):
    if "\t" not in line:
        continue
    key, value = line.rstrip("\n").split("\t", 1)
    seen.setdefault(key, []).append(json.loads(value)["version"])
records = sum(len(versions) for versions in seen.values())
twice = sum(len(v) - len(set(v)) for v in seen.values())
out_of_order = [key for key, versions in seen.items() if versions != sorted(versions)]
print(f"docker-test: {records} records on {len(seen)} keys in demo.orders, {twice} twice, "
      f"{len(out_of_order)} keys out of order", file=sys.stderr)
sys.exit(0 if (records, twice, out_of_order) == (200, 0, []) else 1)
PY
