# Sourced by setup.sh, run.sh and stop_pg.sh: where the peers bench keeps its installs and
# data (never inside the checkout), and its PostgreSQL. common.py derives the same paths.
#
#   PEERS_WORK   installs, the PostgreSQL cluster, logs, results
#                (default ${XDG_CACHE_HOME:-$HOME/.cache}/jobs-engine/peers)
#   PEERS_PORT   the bench's own PostgreSQL, 127.0.0.1 only (default 54400)
#   JE_PYTHON    the Python that runs the jobs-engine side (default: the checkout's .venv)
PEERS_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEERS_REPO="$(cd "$PEERS_HERE/../.." && pwd)"
HOME="${HOME:-$(cd ~ && pwd)}"
PEERS_WORK="$(realpath -m "${PEERS_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/jobs-engine/peers}")"
PEERS_PORT="${PEERS_PORT:-54400}"
JE_PYTHON="${JE_PYTHON:-$PEERS_REPO/.venv/bin/python}"
PEERS_PY="$PEERS_WORK/py-venv/bin/python"      # the driver, PgQueuer, the psycopg baselines
export PEERS_WORK PEERS_PORT JE_PYTHON

# The project's own cluster script, pointed at the bench's data dir and port.
peers_pg() { JOBS_PG_DIR="$PEERS_WORK/pg" JOBS_PG_PORT="$PEERS_PORT" bash "$PEERS_REPO/scripts/postgres.sh" "$@"; }
peers_psql() { psql -X -q -h 127.0.0.1 -p "$PEERS_PORT" -U postgres "$@"; }
