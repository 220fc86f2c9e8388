#!/bin/sh
# The role of this container, from its command; anything else runs as given.
#
# A container that cannot serve exits 1 with one line naming the problem, before a server
# could look alive: web and migrate run manage.py check_ready first; the worker commands
# check the same at their own start-up.
#
# The root filesystem may be read-only (docker/compose.yaml, docker/k8s/): the one place a
# role writes is /tmp, gunicorn's worker heartbeat files. gunicorn's control socket
# (gunicornc) would be made under $HOME, the read-only /app: it is off.
set -e
role="${1:-web}"
case "$role" in
    web|fast|long|schedules|workers|migrate)
        if [ -z "${DATABASE_URL:-}" ]; then
            echo "entrypoint: DATABASE_URL is not set: set it to postgres://user:password@host:port/name" >&2
            exit 1
        fi ;;
esac
case "$role" in
    web)       python manage.py check_ready
               exec gunicorn config.wsgi --bind 0.0.0.0:8000 --workers "${WEB_WORKERS:-2}" \
                   --worker-tmp-dir /tmp --no-control-socket --access-logfile - ;;
    fast)      exec python manage.py run_fast_lane ;;
    long)      exec python manage.py run_long_lane ;;
    schedules) exec python manage.py tick_schedules ;;
    workers)   exec python manage.py run_workers ;;
    migrate)   python manage.py check_ready --unmigrated-ok
               exec python manage.py migrate --noinput ;;
    *)         exec "$@" ;;
esac
