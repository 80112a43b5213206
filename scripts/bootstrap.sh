#!/usr/bin/env bash
# Create or refresh .venv with a Python >= 3.12 and the package installed (editable, with the dev
# extras and the optional dask extra, so the tests of the Dask engine run too).
# Re-installs only when pyproject.toml is newer than the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP=$VENV/.bayesprism-installed

find_python() {
  local cand
  for cand in "${BAYESPRISM_PYTHON:-}" python3.12 python3.13 python3; do
    [ -n "$cand" ] || continue
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  # pyenv shims refuse a bare python3.12 unless PYENV_VERSION names an installed version.
  if command -v pyenv >/dev/null 2>&1; then
    # 3.12 first: the stack is verified there (../shared/STACK.md); newer ones after it.
    for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])(\.|$)' | sort -V); do
      if PYENV_VERSION="$v" pyenv exec python -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
        echo "PYENV_VERSION=$v pyenv exec python"; return 0
      fi
    done
  fi
  return 1
}

if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
  echo "bootstrap: $VENV has Python < 3.12; rebuilding it" >&2
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! PY=$(find_python); then
    echo "bootstrap: no Python >= 3.12 found (tried python3.13, python3.12, python3 and pyenv)." >&2
    echo "bootstrap: PyMC 6 and ArviZ 1.x need Python >= 3.12; install one or set BAYESPRISM_PYTHON=/path/to/python3.12" >&2
    exit 2
  fi
  echo "bootstrap: creating $VENV with $PY" >&2
  eval "$PY -m venv $VENV"
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  echo "bootstrap: installing bayesprism and its dependencies into $VENV (about a minute)" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install --quiet -e '.[dev,dask]'
  touch "$STAMP"
fi
