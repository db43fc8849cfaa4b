#!/usr/bin/env bash
# The embedded default, from a fresh clone: installs Headrace into .venv, starts
# `headrace standalone` (SQLite metastore, local WAL, 2 node processes, 4
# pchannels) in a temporary directory, produces and consumes messages on 4
# vchannels through it, checks every message arrived once and in order, then
# writes a 2-shard collection (inserts and deletes), flushes it with the
# standalone's local Spark into an Iceberg table, reads the table back and
# checks it holds exactly the rows not deleted, and stops. Extra arguments go
# to `headrace demo` (e.g. --count 100000 --rows 100000).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/bootstrap.sh
source scripts/bootstrap.sh pipeline
exec headrace demo "$@"
