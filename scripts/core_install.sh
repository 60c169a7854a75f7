#!/usr/bin/env bash
# A core-only install (`pip install turngym`, no extras) in a fresh virtualenv: turngym imports, Calculator-v0
# plays an episode, and an env whose extra is missing says which one to install. Run by scripts/test.sh.
# The venv is new each run (no system site-packages), so the core dependencies are really installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start=$(date +%s)
"$PY" -m venv "$dir/venv"
"$dir/venv/bin/python" -m pip install --quiet .
# a copy outside the repository, so the installed package (not the checkout) is what imports
cp scripts/core_install_check.py "$dir/"
(cd "$dir" && venv/bin/python core_install_check.py)
echo "core install: $(( $(date +%s) - start )) s (fresh venv, pip install ., Calculator-v0 episode)"
