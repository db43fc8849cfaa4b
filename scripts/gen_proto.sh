#!/usr/bin/env bash
# Regenerate the Python modules of headrace/proto/streaming.proto.
# Usage: scripts/gen_proto.sh [python]   (default: python on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-python}"
"$PYTHON" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
    headrace/proto/streaming.proto
