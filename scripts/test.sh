#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the tests need (Python
# packages into .venv; etcd built from the Go module proxy and broker jars from
# Maven Central into ~/.cache/headrace, both on first use), runs the static
# checks, then pytest against real servers on loopback.
# Extra arguments go to pytest, e.g. scripts/test.sh -k metastore -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/bootstrap.sh
source scripts/bootstrap.sh "dev,kafka,pulsar,operator,pipeline"

echo "== ruff" && ruff check .
echo "== import-linter" && lint-imports
echo "== mypy" && mypy
echo "== test bed (cached under ${XDG_CACHE_HOME:-$HOME/.cache}/headrace; built or fetched once)"
export PYTHONPATH="$PWD/scripts${PYTHONPATH:+:$PYTHONPATH}"
# Builds run here, not inside a test's setup, so no test timeout covers them.
# They are independent: the Go builds share the two cores, the JVM fetches the network.
python -m headrace_testbed.kafka download &
kafka_pid=$!
python -m headrace_testbed.pulsar download &
pulsar_pid=$!
python -m headrace_testbed.etcd build
python -m headrace_testbed.kube build
python -m headrace_testbed.helm build
wait "$kafka_pid"
wait "$pulsar_pid"

echo "== pytest"
set +e
python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "headrace: pytest collected no tests: that is a failure of the suite, not a pass" >&2
  exit 1
fi
exit "$rc"
