#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and install Headrace into it.
# Usage: source scripts/bootstrap.sh [extras]    e.g. extras="dev,kafka,pulsar"
# Honours HEADRACE_VENV (default: .venv in the repository) and PYTHON (default: python3).
set -euo pipefail
_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_venv="${HEADRACE_VENV:-$_repo/.venv}"
_python="${PYTHON:-python3}"
_extras="${1:-}"

if ! "$_python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "headrace: Python >= 3.11 is required (tried '$_python'; set PYTHON=...)" >&2
  exit 2
fi
if [ ! -x "$_venv/bin/python" ]; then
  echo "headrace: creating virtualenv $_venv" >&2
  "$_python" -m venv "$_venv"
fi
_stamp="$_venv/.headrace-install-${_extras:-base}"
if [ ! -f "$_stamp" ] || [ "$_repo/pyproject.toml" -nt "$_stamp" ]; then
  echo "headrace: installing Headrace${_extras:+ [$_extras]} into $_venv" >&2
  "$_venv/bin/python" -m pip install -q --upgrade pip
  if [ -n "$_extras" ]; then
    "$_venv/bin/python" -m pip install -q -e "$_repo[$_extras]"
  else
    "$_venv/bin/python" -m pip install -q -e "$_repo"
  fi
  touch "$_stamp"
fi
export PATH="$_venv/bin:$PATH"
export HEADRACE_VENV="$_venv"
