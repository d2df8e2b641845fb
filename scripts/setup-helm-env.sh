#!/usr/bin/env bash
# Creates .venv-helm: Python 3.12 with the real Helm library (helm-sdkpy bundles Helm v4 and
# needs Python >= 3.12) and the kmock API emulator the chart is installed against. The chart
# tests (tests/chart/) run tests/chart/helm_check.py with it. Idempotent: an existing
# environment with the pinned versions is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_SDKPY=0.1.32
KMOCK=0.8
PYYAML=6.0.2

find_python() {
  if [ -n "${PYTHON312:-}" ]; then echo "$PYTHON312"; return; fi
  for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$candidate"; return
    fi
  done
  # pyenv's shim answers only with the version selected.
  if command -v pyenv >/dev/null && PYENV_VERSION=3.12.1 python3.12 -V >/dev/null 2>&1; then
    PYENV_VERSION=3.12.1 pyenv which python3.12; return
  fi
  echo "setup-helm-env: no Python 3.12 found (set PYTHON312=/path/to/python3.12)" >&2
  exit 1
}

if [ -x .venv-helm/bin/python ] && .venv-helm/bin/python - <<PY 2>/dev/null
from importlib.metadata import version
assert version("helm-sdkpy") == "$HELM_SDKPY" and version("kmock") == "$KMOCK"
import helm_sdkpy, kmock, yaml
PY
then
  echo "setup-helm-env: .venv-helm ready (helm-sdkpy $HELM_SDKPY, kmock $KMOCK)"
  exit 0
fi

PY=$(find_python)
[ -x .venv-helm/bin/python ] || "$PY" -m venv .venv-helm
.venv-helm/bin/python -m pip install --quiet --upgrade pip
.venv-helm/bin/python -m pip install --quiet "helm-sdkpy==$HELM_SDKPY" "kmock==$KMOCK" "PyYAML>=$PYYAML"
.venv-helm/bin/python -c 'import helm_sdkpy; print("setup-helm-env: .venv-helm ready,", helm_sdkpy.get_version())'
