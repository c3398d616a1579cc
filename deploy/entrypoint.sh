#!/bin/sh
# The image's entry: run the given spotbroker command. Before `serve`, make the
# database ready (`spotbroker db ready`): migrate it when SPOTBROKER_MIGRATE_ON_START
# is true (the default: one broker, docker compose), else wait until a migration
# job has (deploy/kubernetes: several replicas must not race to migrate). Both wait
# SPOTBROKER_DB_WAIT_SECONDS for a database that does not answer yet.
set -eu
if [ "${1:-}" = serve ]; then
    spotbroker db ready
fi
exec spotbroker "$@"
