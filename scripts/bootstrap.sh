#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and install Headrace into it.
# Usage: source scripts/bootstrap.sh [extras]    e.g. extras="dev,kafka,pulsar"
# Honours HEADRACE_VENV (default: .venv in the repository) and PYTHON (default: python3).
#
# Safe to source into an interactive shell: it sets no shell options (no
# `set -e`, `-u` or `pipefail` leak into the caller), keeps its variables local
# to a function, and on failure returns (when sourced) or exits (when run) with
# a non-zero code instead of closing the shell.

_headrace_bootstrap() {
  unset -f _headrace_bootstrap # leave nothing behind in the caller's shell
  local repo venv python extras stamp
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
  venv="${HEADRACE_VENV:-$repo/.venv}"
  python="${PYTHON:-python3}"
  extras="${1:-}"

  if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
    echo "headrace: Python >= 3.11 is required (tried '$python'; set PYTHON=...)" >&2
    return 2
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "headrace: creating virtualenv $venv" >&2
    "$python" -m venv "$venv" || {
      echo "headrace: could not create the virtualenv $venv" >&2
      return 1
    }
  fi
  stamp="$venv/.headrace-install-${extras:-base}"
  if [ ! -f "$stamp" ] || [ "$repo/pyproject.toml" -nt "$stamp" ]; then
    echo "headrace: installing Headrace${extras:+ [$extras]} into $venv" >&2
    "$venv/bin/python" -m pip install -q --upgrade pip || {
      echo "headrace: upgrading pip in $venv failed" >&2
      return 1
    }
    if ! "$venv/bin/python" -m pip install -q -e "$repo${extras:+[$extras]}"; then
      echo "headrace: installing Headrace into $venv failed" >&2
      return 1
    fi
    touch "$stamp" || return 1
  fi
  export PATH="$venv/bin:$PATH"
  export HEADRACE_VENV="$venv"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  _headrace_bootstrap "$@"
  exit
fi
_headrace_bootstrap "$@"
