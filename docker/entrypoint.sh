#!/bin/sh
# The role of this container, from its command; anything else runs as given.
set -e
role="${1:-web}"
case "$role" in
    web)       exec gunicorn config.wsgi --bind 0.0.0.0:8000 --workers "${WEB_WORKERS:-2}" \
                   --access-logfile - ;;
    fast)      exec python manage.py run_fast_lane ;;
    long)      exec python manage.py run_long_lane ;;
    schedules) exec python manage.py tick_schedules ;;
    workers)   exec python manage.py run_workers ;;
    migrate)   exec python manage.py migrate --noinput ;;
    *)         exec "$@" ;;
esac
