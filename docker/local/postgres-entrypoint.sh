#!/bin/sh
# First start: initdb, a password for POSTGRES_USER, the POSTGRES_DB database; then the
# server in the foreground (as the official image does).
set -eu
BIN="$(ls -d /usr/lib/postgresql/*/bin | tail -n1)"
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    echo "$POSTGRES_PASSWORD" > /tmp/pwfile
    chown postgres /tmp/pwfile
    su postgres -c "$BIN/initdb -D $PGDATA -U $POSTGRES_USER --pwfile=/tmp/pwfile --auth-local=trust --auth-host=scram-sha-256" >/dev/null
    rm -f /tmp/pwfile
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    su postgres -c "$BIN/pg_ctl -D $PGDATA -w -o '-c listen_addresses=' start" >/dev/null
    su postgres -c "$BIN/createdb -U $POSTGRES_USER $POSTGRES_DB"
    su postgres -c "$BIN/pg_ctl -D $PGDATA -w stop" >/dev/null
fi
exec su postgres -c "exec $BIN/postgres -D $PGDATA"
