#!/bin/sh
# Wait for the database, migrate it, then run the given spotbroker command.
# Several brokers may start together: migrations take the database's own lock.
set -eu
tries=${SPOTBROKER_DB_WAIT_SECONDS:-60}
until spotbroker db upgrade; do
    tries=$((tries - 1))
    if [ "$tries" -le 0 ]; then
        echo "spotbroker: the database did not become reachable" >&2
        exit 1
    fi
    sleep 1
done
exec spotbroker "$@"
