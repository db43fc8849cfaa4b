#!/usr/bin/env bash
# The embedded default, from a fresh clone: installs Headrace into .venv, starts
# `headrace standalone` (SQLite metastore, local WAL, 2 node processes, 4
# pchannels) in a temporary directory, produces and consumes messages on 4
# vchannels through it, checks every message arrived once and in order, and
# stops it. Extra arguments go to `headrace demo` (e.g. --count 100000).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/bootstrap.sh
source scripts/bootstrap.sh
exec headrace demo "$@"
