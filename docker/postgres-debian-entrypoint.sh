#!/bin/sh
# The official postgres image's first start, in short: an empty data dir gets a cluster
# owned by POSTGRES_USER with POSTGRES_PASSWORD (scram-sha-256 over TCP) and the database
# POSTGRES_DB; then postgres runs in the foreground on PGPORT (default 5432).
set -eu
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD (the official image refuses to start without one too)}"
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$user" --pwfile="$pwfile" --auth-local=trust \
        --auth-host=scram-sha-256 --encoding=UTF8 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    if [ "$db" != postgres ]; then
        echo "CREATE DATABASE \"$db\" OWNER \"$user\";" \
            | postgres --single -D "$PGDATA" -j postgres >/dev/null
    fi
    echo "postgres-entrypoint: initialised $PGDATA (user $user, database $db)"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -p "${PGPORT:-5432}" "$@"
