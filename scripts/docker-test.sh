#!/usr/bin/env bash
# Smoke test of docker/ with a real Docker daemon: build the images (the app's tagged with the
# project's version, the compose file's default), bring the whole system up (PostgreSQL,
# Kafka, migrate, web, 3 fast, 2 long, 2 schedule workers) with a database password of its
# own, wait for health; the app's containers are hardened (read-only root, no capabilities,
# no privilege gain) and the web port answers on 127.0.0.1 only; demo_admin prints a random
# password that logs in and refuses the published one; containers with bad settings exit 1
# with one line; 200 order events and 2,000 events on 50
# keys reach the topic once each, in order per key; a docker-killed fast worker's partitions
# are taken over (2,000 more, none lost); scaled to 5 fast workers, the partitions rebalance
# (2,000 more); then take it down with its volumes. Starts its own dockerd (vfs, private socket) when no
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
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
fi

RUN_DIR="$(mktemp -d)"
DAEMON_PID=
cleanup() {
    [[ -n "${COMPOSE_UP:-}" ]] && compose down -v --remove-orphans >&2 || true
    if [[ -n "$DAEMON_PID" ]]; then
        # Our own daemon's cache only: each run's rebuilt images leave the last run's
        # untagged, full copies on vfs (~2.5 GB a run).
        docker image prune -f >/dev/null 2>&1 || true
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
# The tag the compose file runs by default, and docs/workers.md builds: the project's version.
VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/jobs_engine/__init__.py")"
APP_IMAGE="jobs-engine-demo:$VERSION"
docker build -q -f "$ROOT/docker/Dockerfile" --build-arg "BASE_IMAGE=$BASE" \
    -t "$APP_IMAGE" "$ROOT" >/dev/null
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

# APP_IMAGE is not exported: compose runs its default, the tag just built. The database
# password is not the compose file's default, so the app only reaches it through the variable.
export POSTGRES_IMAGE=jobs-engine-postgres:local \
       KAFKA_IMAGE=jobs-engine-kafka:local WEB_PORT="${WEB_PORT:-18000}" \
       DJANGO_SECRET_KEY="smoke-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
       POSTGRES_PASSWORD="pw-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export -n APP_IMAGE  # a caller's exported one included
unset WEB_BIND       # the default binding is what is checked
compose() { docker-compose -f "$ROOT/docker/compose.yaml" -p "$PROJECT" "$@"; }

note "compose up: 3 fast, 2 long, 2 schedule workers"
COMPOSE_UP=1
# A killed run's leftovers: its database volume holds another password.
compose down -v --remove-orphans >/dev/null 2>&1 || true
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

# The app's containers as the compose file hardens them; the web port on 127.0.0.1 only.
for id in $(compose ps -q migrate web fast long schedules); do
    state="$(docker inspect -f '{{.Name}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}} {{.HostConfig.SecurityOpt}} {{.Config.User}}' "$id")"
    [[ "$state" == *" true [ALL] [no-new-privileges:true] jobs" ]] \
        || { note "not hardened: $state"; exit 1; }
done
# /var/tmp is writable by anyone on a writable root; /tmp is the tmpfs.
compose exec -T web sh -c 'touch /var/tmp/written' 2>/dev/null \
    && { note "the web container's root filesystem is writable"; exit 1; }
compose exec -T web sh -c 'touch /tmp/written' || { note "the web's /tmp is not writable"; exit 1; }
bound="$(compose port web 8000)"
[[ "$bound" == "127.0.0.1:$WEB_PORT" ]] || { note "web port bound to $bound"; exit 1; }
python3 - "$WEB_PORT" <<'PY'
import sys
import urllib.request

with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/admin/login/", timeout=10) as r:
    assert r.status == 200, r.status
PY
note "the app's containers are hardened; the admin answers on $bound"

# The admin login of docs/operators.md: with DEBUG off a random password, printed; the published
# one refused.
printed="$(compose exec -T web python manage.py demo_admin | grep '^admin user: ' || true)"
password="${printed##*  password: }"
[[ "$printed" == "admin user: admin  password: "* && "$password" != admin-demo-password \
   && ${#password} -ge 20 ]] || { note "demo_admin printed: $printed"; exit 1; }
compose exec -T web python manage.py shell -c "from django.contrib.auth import authenticate
print(authenticate(username='admin', password='$password') is not None)" | grep -x True >/dev/null \
    || { note "demo_admin's password does not log in"; exit 1; }
if compose exec -T -e DEMO_ADMIN_PASSWORD=admin-demo-password web python manage.py demo_admin \
        >/dev/null 2>&1; then
    note "demo_admin took the published password with DEBUG off"; exit 1
fi
note "demo_admin: a random password that logs in; the published one refused"

sql() { compose exec -T postgres psql -U jobs -d jobs -Atc "$1"; }
# Every partition leased, by exactly $1 live fast-lane workers, 64/$1 each (rounded either way).
partitions_shared_by() {
    sql "SELECT COUNT(*) = $1 AND SUM(n) = 64 AND MIN(n) >= 64 / $1 AND MAX(n) <= (63 + $1) / $1
         FROM (SELECT COUNT(*) AS n FROM jobs_engine_partition p
               JOIN jobs_engine_worker w ON w.worker_id = p.owner
               WHERE p.lease_until > now() AND w.heartbeat_at > now() - interval '30 seconds'
               GROUP BY p.owner) AS shares"
}
wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND prints t
    local limit=$1 what=$2 started=$SECONDS
    shift 2
    until [[ "$("$@")" == t ]]; do
        if (( SECONDS - started > limit )); then
            note "$what: not after $limit s"
            sql "SELECT status, last_error, COUNT(*) FROM jobs_engine_job GROUP BY 1, 2" >&2
            sql "SELECT owner, COUNT(*), MAX(lease_until) FROM jobs_engine_partition GROUP BY 1" >&2
            sql "SELECT worker_id, hostname, lanes, heartbeat_at FROM jobs_engine_worker" >&2
            sql "SELECT target, reason FROM jobs_engine_targetpause" >&2
            compose logs --tail 15 fast >&2
            exit 1
        fi
        sleep 1
    done
    note "$what ($((SECONDS - started)) s)"
}
drained() { sql "SELECT COUNT(*) = 0 FROM jobs_engine_job WHERE target = 'kafka:demo.orders'"; }
# The topic read back from the start: $1 records, each (key, version) once, per key in order.
check_topic() {
    compose exec -T kafka /opt/kafka/bin/kafka-console-consumer.sh \
        --bootstrap-server localhost:9092 --topic demo.orders --from-beginning \
        --timeout-ms 8000 --property print.key=true >"$RUN_DIR/orders.txt" 2>/dev/null || true
    python3 - "$RUN_DIR/orders.txt" "$1" <<'PY'
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
print(f"docker-test: {records} records on {len(seen)} keys in demo.orders (expected "
      f"{sys.argv[2]}), {twice} twice, {len(out_of_order)} keys out of order", file=sys.stderr)
sys.exit(0 if (records, twice, out_of_order) == (int(sys.argv[2]), 0, []) else 1)
PY
}
load() {  # load N: N events on 50 keys, enqueued through the web container
    compose exec -T web python manage.py enqueue_demo --events 0 --orders 0 --load "$1" \
        --keys 50 >&2
}

# A container that cannot serve exits 1 with one line naming the problem (and no traceback).
bad_start() {  # bad_start EXPECTED ROLE [docker run options...]
    local expected=$1 role=$2 out rc=0 lines
    shift 2
    out="$(docker run --rm --network "${PROJECT}_default" "${hardened[@]}" "$@" "$APP_IMAGE" \
           "$role" 2>&1)" \
        || rc=$?
    lines="$(printf '%s\n' "$out" | grep -c .)"
    if [[ $rc != 1 || $lines != 1 || "$out" != *"$expected"* ]]; then
        note "$role with a bad setting: exit $rc, $lines line(s), expected 1 line: $expected"
        printf '%s\n' "$out" >&2
        exit 1
    fi
    note "$role: exit 1: $out"
}
secret=(-e "DJANGO_SECRET_KEY=$DJANGO_SECRET_KEY")
hardened=(--read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges:true)
sql "CREATE DATABASE unmigrated" >/dev/null
bad_start "DATABASE_URL is not set" fast "${secret[@]}"
bad_start "DJANGO_SECRET_KEY is not set" web -e DATABASE_URL=postgres://jobs:$POSTGRES_PASSWORD@postgres/jobs
bad_start "cannot connect to the database" fast "${secret[@]}" \
    -e DATABASE_URL=postgres://jobs:$POSTGRES_PASSWORD@nowhere.invalid:5432/jobs
bad_start "password authentication failed" web "${secret[@]}" \
    -e DATABASE_URL=postgres://jobs:wrong@postgres:5432/jobs
bad_start "the database is not migrated" web "${secret[@]}" \
    -e DATABASE_URL=postgres://jobs:$POSTGRES_PASSWORD@postgres:5432/unmigrated
bad_start "the database is not migrated" schedules "${secret[@]}" \
    -e DATABASE_URL=postgres://jobs:$POSTGRES_PASSWORD@postgres:5432/unmigrated
[[ "$(compose exec -T postgres psql -U jobs -d unmigrated -Atc \
      "SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'")" == 0 ]] \
    || { note "a refused start wrote tables"; exit 1; }

wait_for 60 "3 fast-lane workers share the 64 partitions" partitions_shared_by 3
note "200 order events (50 orders, 4 versions each) and 2,000 events on 50 keys"
compose exec -T web python manage.py enqueue_demo --orders 50 >&2
load 2000
wait_for 180 "delivered" drained
check_topic 2200

# Not "| head -1": head exits early, compose gets SIGPIPE, and pipefail fails the script.
mapfile -t fast_containers < <(compose ps -q fast)
victim="${fast_containers[0]}"
victim_worker="$(sql "SELECT worker_id FROM jobs_engine_worker
                      WHERE hostname = '$(docker inspect -f '{{.Config.Hostname}}' "$victim")'")"
note "docker kill $victim_worker, then 2,000 more events on 50 new keys"
docker kill "$victim" >/dev/null
load 2000
wait_for 120 "its partitions taken over by the 2 others" partitions_shared_by 2
wait_for 180 "delivered" drained
[[ "$(sql "SELECT COUNT(*) FROM jobs_engine_partition WHERE owner = '$victim_worker'")" == 0 ]] \
    || { note "the killed worker still owns partitions"; exit 1; }
check_topic 4200

note "scale the fast lane to 5 workers, then 2,000 more events"
compose up -d --no-recreate --scale fast=5 --scale long=2 --scale schedules=2 >&2
wait_for 120 "5 fast-lane workers share the 64 partitions" partitions_shared_by 5
load 2000
wait_for 180 "delivered" drained
check_topic 6200
note "passed in $SECONDS s"
